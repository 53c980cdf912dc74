"""Log lines: the spec's lines come out verbatim, from structlog and from stdlib records alike."""

from __future__ import annotations

import io
import logging

import pytest
from pydantic import SecretStr

from levers9 import logs


@pytest.fixture
def stream() -> io.StringIO:
    out = io.StringIO()
    logs.setup("DEBUG", out)
    return out


def _message_part(line: str) -> str:
    # `<timestamp> <LEVEL> <message ...>`
    return line.split(maxsplit=2)[2]


def test_spec_lines_verbatim(stream: io.StringIO) -> None:
    log = logs.get_logger()
    log.info("loaded controller", gpu_type="RTXPro6000", mode="external", pool_name="gke-rtx6000")
    log.error("unable to load controller", error="invalid provider name", pool_name="old")
    log.info("host driver libraries registered with the loader", dirs=["/usr/local/nvidia/lib64"])
    lines = [_message_part(line) for line in stream.getvalue().splitlines()]
    assert lines == [
        "loaded controller gpu_type=RTXPro6000 mode=external pool_name=gke-rtx6000",
        'unable to load controller error="invalid provider name" pool_name=old',
        'host driver libraries registered with the loader dirs=["/usr/local/nvidia/lib64"]',
    ]


def test_stdlib_records_with_fields(stream: io.StringIO) -> None:
    logging.getLogger("levers9.workflows").info(
        "using existing machine", extra={logs.KV_EXTRA: {"hostname": "gke-node-1", "machine_id": 7}}
    )
    [line] = stream.getvalue().splitlines()
    assert _message_part(line) == "using existing machine hostname=gke-node-1 machine_id=7"
    assert line.split()[1] == "INFO"


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        (3, "3"),
        (True, "true"),
        (None, "null"),
        (["a b"], '"[\\"a b\\"]"'),
        (SecretStr("hidden"), "**********"),
    ],
)
def test_value_rendering(value: object, rendered: str) -> None:
    assert logs.format_value(value) == rendered
