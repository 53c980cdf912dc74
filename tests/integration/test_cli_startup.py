"""The CLI starts at once: `levers9 --help` imports no command group (each is imported when it
runs), `levers9 run` and `levers9 task ...` load neither the Temporal SDK, the cloud SDKs nor
the emulator, and the help lines of the top-level table say what each group's own help says.
The CPU-seconds this costs are measured in benchmarks/cli.py (no timing is asserted here: these
machines are shared)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import typer

from levers9.cli.main import COMMANDS

HEAVY = ("temporalio", "google", "kubernetes", "grpc", "boto3", "botocore", "sandbox", "pydantic")
CLOUD = ("google.cloud", "google.api_core", "kubernetes", "boto3", "botocore", "sandbox")


_LIST_MODULES = """
import contextlib, sys
from levers9.cli.main import app
sys.argv = ["levers9", *sys.argv[1:]]
with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
    app()
print("\\n".join(sorted(sys.modules)))
"""


def _imported(*args: str) -> set[str]:
    """The modules a fresh `levers9 ARGS` has imported when it is done."""
    done = subprocess.run(
        [sys.executable, "-c", _LIST_MODULES, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_help_imports_no_command_group() -> None:
    modules = _imported("--help")
    assert "typer" in modules, "the importtime listing was read"
    groups = {entry.module for entry in COMMANDS.values()}
    assert not modules & groups, sorted(modules & groups)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == []


@pytest.mark.parametrize("args", [("task", "get", "--help"), ("run", "--help")])
def test_task_commands_load_neither_the_temporal_sdk_nor_cloud_sdks(args: tuple[str, ...]) -> None:
    """`run` and `task get` ask the gateway (tests/integration/test_tasks_sandbox.py); the SDK
    is loaded only when they fall back to Temporal."""
    modules = _imported(*args)
    assert "levers9.cli.task" in modules
    assert "grpc" in modules, "the gateway's client is loaded"
    unneeded = sorted(m for m in modules if m.startswith((*CLOUD, "temporalio", "structlog")))
    assert unneeded == []


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_table_says_what_each_group_says(name: str) -> None:
    entry = COMMANDS[name]
    target = getattr(importlib.import_module(entry.module), entry.attr)
    own = target.info.help if isinstance(target, typer.Typer) else target.__doc__
    assert own is not None
    assert own.strip().splitlines()[0] == entry.help
