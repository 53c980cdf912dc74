"""Protobuf request bodies (what kubectl's `create` generators send): the envelope, nested
messages, maps and zero values, and the 415 for fields the emulator does not describe."""

from __future__ import annotations

import pytest

from sandbox import errors
from sandbox.protobuf import decode_object


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return b"k8s\x00" + field(1, type_meta) + field(2, raw)


def metadata(name: str) -> bytes:
    label = field(1, b"team") + field(2, b"gpu")
    return field(1, name.encode()) + field(2, b"") + field(7, 0) + field(11, label)


def test_namespace() -> None:
    obj = decode_object(envelope("v1", "Namespace", field(1, metadata("gpu")) + field(2, b"")))
    assert obj == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "gpu", "labels": {"team": "gpu"}},
        "spec": {},
    }


def test_deployment_keeps_pointer_zero_values() -> None:
    container = field(1, b"c") + field(2, b"nginx") + field(8, b"") + field(16, 0)
    template = field(2, field(2, container))
    spec = field(1, 0) + field(3, template)
    obj = decode_object(envelope("apps/v1", "Deployment", field(1, metadata("d")) + field(2, spec)))
    assert obj["spec"]["replicas"] == 0
    assert obj["spec"]["template"]["spec"]["containers"] == [
        {"name": "c", "image": "nginx", "resources": {}}
    ]


def test_secret_data_is_base64() -> None:
    entry = field(1, b"token") + field(2, b"\x00\x01")
    obj = decode_object(envelope("v1", "Secret", field(1, metadata("s")) + field(2, entry)))
    assert obj["data"] == {"token": "AAE="}


@pytest.mark.parametrize(
    "body",
    [
        envelope("v1", "Service", b""),
        envelope("v1", "Namespace", field(1, metadata("x")) + field(99, b"set")),
    ],
)
def test_undescribed_kinds_and_fields_are_refused(body: bytes) -> None:
    with pytest.raises(errors.ApiError) as caught:
        decode_object(body)
    assert caught.value.code == 415
