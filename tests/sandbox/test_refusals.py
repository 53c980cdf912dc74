"""Writes the apiserver refuses, refused here with its codes and texts, and nothing written: a
`dryRun` other than `All` (422 against the verb's options, before the body is read), Secret
`data` that is not base64 (400 from the decoder on create and replace, 422 on `patch` for a
patch), a Secret's `type` changed (422, immutable) or an immutable Secret's data, and a
finalizer added to an object already being deleted (422). Driven by the official client and by
kubectl, which print them as on GKE."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client

from tests.sandbox.factories import Api, status_of, unique

Kubectl = Callable[..., str]
Http = Callable[..., urllib3.BaseHTTPResponse]


def refused(code: int, call: Callable[[], Any]) -> dict[str, Any]:
    """The Status body of a call that must fail with `code`."""
    with pytest.raises(client.ApiException) as raised:
        call()
    assert raised.value.status == code, raised.value.body
    return status_of(raised.value)


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": data}


def secret(name: str, data: dict[str, str], **more: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": data, **more}


# -- dryRun ---------------------------------------------------------------------------------------


def _create(core: Api, ns: str, name: str, dry_run: str | None) -> None:
    kwargs = {"dry_run": dry_run} if dry_run else {}
    core.create_namespaced_config_map(ns, config_map(name, k="new"), **kwargs)


def _replace(core: Api, ns: str, name: str, dry_run: str | None) -> None:
    kwargs = {"dry_run": dry_run} if dry_run else {}
    core.replace_namespaced_config_map(name, ns, config_map(name, k="new"), **kwargs)


def _patch(core: Api, ns: str, name: str, dry_run: str | None) -> None:
    kwargs = {"dry_run": dry_run} if dry_run else {}
    core.patch_namespaced_config_map(name, ns, {"data": {"k": "new"}}, **kwargs)


def _delete(core: Api, ns: str, name: str, dry_run: str | None) -> None:
    kwargs = {"dry_run": dry_run} if dry_run else {}
    core.delete_namespaced_config_map(name, ns, **kwargs)


def _state(core: Api, ns: str, name: str) -> str | None:
    """The config map's `k`, or None when there is none."""
    try:
        found = core.read_namespaced_config_map(name, ns)
    except client.ApiException as error:
        if error.status != 404:
            raise
        return None
    value: str = found.data["k"]
    return value


@pytest.mark.parametrize(
    ("verb", "options", "exists", "written"),
    [
        (_create, "CreateOptions", False, "new"),
        (_replace, "UpdateOptions", True, "new"),
        (_patch, "PatchOptions", True, "new"),
        (_delete, "DeleteOptions", True, None),
    ],
    ids=["create", "replace", "patch", "delete"],
)
def test_a_dry_run_other_than_all_is_invalid_and_writes_nothing(
    core: Api,
    namespace: str,
    verb: Callable[[Api, str, str, str | None], None],
    options: str,
    exists: bool,
    written: str | None,
) -> None:
    name = unique("cm")
    if exists:
        core.create_namespaced_config_map(namespace, config_map(name, k="old"))
    before = _state(core, namespace, name)
    status = refused(422, lambda: verb(core, namespace, name, "foo"))
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        f'{options}.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["foo"]: '
        'supported values: "All"'
    )
    assert status["details"] == {
        "group": "meta.k8s.io",
        "kind": options,
        "causes": [
            {
                "reason": "FieldValueNotSupported",
                "message": 'Unsupported value: ["foo"]: supported values: "All"',
                "field": "dryRun",
            }
        ],
    }
    assert _state(core, namespace, name) == before
    verb(core, namespace, name, "All")  # the one dry run there is: accepted, nothing written
    assert _state(core, namespace, name) == before
    verb(core, namespace, name, None)  # and the same call, for real, writes
    assert _state(core, namespace, name) == written


def test_every_dry_run_value_must_be_all(http: Http, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    answer = http("POST", path + "?dryRun=All&dryRun=client", body=config_map("c", k="v"))
    assert answer.status == 422
    assert json.loads(answer.data)["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["All","client"]: '
        'supported values: "All"'
    )
    assert http("GET", path + "/c").status == 404


def test_kubectl_dry_run_server_writes_nothing(kubectl: Kubectl, namespace: str) -> None:
    name = unique("cm")
    printed = kubectl("-n", namespace, "create", "configmap", name, "--dry-run=server")
    assert printed.strip() == f"configmap/{name} created (server dry run)"
    missing = kubectl("-n", namespace, "get", "configmap", name, ok=False)
    assert f'configmaps "{name}" not found' in missing


# -- Secret data and type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "offset"),
    [("not base64", 3), ("c2VjcmV0!", 8), ("c2VjcmV0", None), ("YWJjZA=", 7), ("YW\nJj", None)],
)
def test_secret_data_must_be_base64(
    core: Api, namespace: str, value: str, offset: int | None
) -> None:
    name = unique("s")

    def create() -> None:
        core.create_namespaced_secret(namespace, secret(name, {"k": value}))

    if offset is None:
        create()  # Go's decoder reads it (newlines skipped): so do we
        return
    status = refused(400, create)
    assert (status["reason"], status["message"]) == (
        "BadRequest",
        'Secret in version "v1" cannot be handled as a Secret: '
        f"illegal base64 data at input byte {offset}",
    )
    refused(404, lambda: core.read_namespaced_secret(name, namespace))


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("%%", "illegal base64 data at input byte 0"),
        (
            5,
            "json: cannot unmarshal number into Go struct field ConfigMap.binaryData "
            "of type []uint8",
        ),
    ],
    ids=["not-base64", "not-a-string"],
)
def test_config_map_binary_data_must_be_base64_too(
    http: Http, namespace: str, value: Any, problem: str
) -> None:
    """Over raw HTTP: the official client would refuse a number before sending it."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    body = {"metadata": {"name": "c"}, "binaryData": {"b": value}}
    answer = http("POST", path, body=body)
    assert answer.status == 400
    assert json.loads(answer.data)["message"] == (
        f'ConfigMap in version "v1" cannot be handled as a ConfigMap: {problem}'
    )
    assert http("GET", path + "/c").status == 404


def test_bad_secret_data_in_a_replace_or_a_patch_changes_nothing(core: Api, namespace: str) -> None:
    name = unique("s")
    core.create_namespaced_secret(namespace, secret(name, {"k": "b2xk"}))
    status = refused(
        400, lambda: core.replace_namespaced_secret(name, namespace, secret(name, {"k": "%%"}))
    )
    assert status["message"].endswith("illegal base64 data at input byte 0")
    status = refused(
        422, lambda: core.patch_namespaced_secret(name, namespace, {"data": {"k": "%%"}})
    )
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        ' "" is invalid: patch: Invalid value: "{\\"data\\":{\\"k\\":\\"%%\\"}}": '
        "illegal base64 data at input byte 0"
    )
    assert status["details"]["causes"][0]["field"] == "patch"
    assert core.read_namespaced_secret(name, namespace).data == {"k": "b2xk"}
    core.patch_namespaced_secret(name, namespace, {"data": {"k": "bmV3"}})  # good data: written
    assert core.read_namespaced_secret(name, namespace).data == {"k": "bmV3"}


def test_a_secrets_type_is_immutable(core: Api, namespace: str) -> None:
    name = unique("s")
    core.create_namespaced_secret(namespace, secret(name, {"k": "dg=="}))
    assert core.read_namespaced_secret(name, namespace).type == "Opaque"  # defaulted
    changed = secret(name, {"k": "dg=="}, type="example.com/custom")
    status = refused(422, lambda: core.replace_namespaced_secret(name, namespace, changed))
    assert status["message"] == (
        f'Secret "{name}" is invalid: type: Invalid value: "example.com/custom": field is immutable'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "example.com/custom": field is immutable',
            "field": "type",
        }
    ]
    assert core.read_namespaced_secret(name, namespace).type == "Opaque"
    # The rest of the object may change: the same replace with the type kept is written.
    core.replace_namespaced_secret(name, namespace, secret(name, {"k": "dzI="}, type="Opaque"))
    assert core.read_namespaced_secret(name, namespace).data == {"k": "dzI="}


def test_an_immutable_secret_keeps_its_data(core: Api, namespace: str) -> None:
    name = unique("s")
    core.create_namespaced_secret(namespace, secret(name, {"k": "dg=="}, immutable=True))
    core.patch_namespaced_secret(name, namespace, {"metadata": {"labels": {"a": "b"}}})
    status = refused(
        422, lambda: core.patch_namespaced_secret(name, namespace, {"data": {"k": "dzI="}})
    )
    assert status["message"] == (
        f'Secret "{name}" is invalid: data: Forbidden: field is immutable when `immutable` is set'
    )
    assert core.read_namespaced_secret(name, namespace).data == {"k": "dg=="}


def test_kubectl_prints_the_secret_refusals(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    name = unique("s")
    manifest = tmp_path / "secret.json"
    body = {"apiVersion": "v1", "kind": "Secret", **secret(name, {"k": "not base64"})}
    manifest.write_text(json.dumps(body))
    error = kubectl("-n", namespace, "create", "-f", str(manifest), ok=False)
    assert "Error from server (BadRequest): " in error
    assert (
        'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 3'
    ) in error
    manifest.write_text(json.dumps({**body, "data": {"k": "dg=="}}))
    kubectl("-n", namespace, "apply", "-f", str(manifest))
    manifest.write_text(json.dumps({**body, "data": {"k": "dg=="}, "type": "example.com/x"}))
    error = kubectl("-n", namespace, "apply", "-f", str(manifest), ok=False)
    assert (
        f'The Secret "{name}" is invalid: type: Invalid value: "example.com/x": field is immutable'
    ) in error
    assert kubectl("-n", namespace, "get", "secret", name, "-o", "jsonpath={.type}") == "Opaque"


# -- finalizers -----------------------------------------------------------------------------------

HOLD = "example.com/hold"


def test_no_new_finalizer_on_an_object_being_deleted(
    core: Api, kubectl: Kubectl, namespace: str
) -> None:
    name = unique("cm")
    held = config_map(name, k="v")
    held["metadata"]["finalizers"] = [HOLD]
    core.create_namespaced_config_map(namespace, held)
    # Before the delete a finalizer may be added (and taken off again).
    core.patch_namespaced_config_map(name, namespace, {"metadata": {"finalizers": [HOLD, "a/b"]}})
    core.patch_namespaced_config_map(
        name, namespace, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/b"]}}
    )
    core.delete_namespaced_config_map(name, namespace)
    terminating = core.read_namespaced_config_map(name, namespace)
    assert terminating.metadata.deletion_timestamp is not None
    expected = (
        f'ConfigMap "{name}" is invalid: metadata.finalizers: Forbidden: no new finalizers can '
        'be added if the object is being deleted, found new finalizers []string{"a/b", "c/d"}'
    )
    status = refused(
        422,
        lambda: core.patch_namespaced_config_map(
            name, namespace, {"metadata": {"finalizers": [HOLD, "c/d", "a/b"]}}
        ),
    )
    assert status["message"] == expected
    assert status["details"]["causes"][0]["field"] == "metadata.finalizers"
    error = kubectl(
        "-n",
        namespace,
        "patch",
        "configmap",
        name,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"finalizers": [HOLD, "a/b", "c/d"]}}),
        ok=False,
    )
    assert f"The {expected}" in error
    assert core.read_namespaced_config_map(name, namespace).metadata.finalizers == [HOLD]
    # Taking the last one off is allowed, and ends the deletion.
    core.patch_namespaced_config_map(name, namespace, {"metadata": {"finalizers": None}})
    refused(404, lambda: core.read_namespaced_config_map(name, namespace))
