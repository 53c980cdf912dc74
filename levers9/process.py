"""Running and leaving a process that loaded the gRPC core (every one that imports temporalio
or grpc)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, NoReturn, TypeVar

import uvloop

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Runs `main` on uvloop, as the controlplane does: its loop carries the endpoints' front
    (and port-forward, logs, exec relays), and uvloop's sockets and TLS took about a fifth off
    the endpoints' warm proxy overhead (benchmarks/README.md).

    Such a process never spawns through its loop (`asyncio.create_subprocess_*`): libuv forks,
    and in a process that runs gRPC the child crashed in gRPC's fork handlers before its exec
    ("Check failed: next_worker->state == KICKED", exit 134/139), as the worker agent's runc
    children did in CI. `run_command` spawns as CPython does (vfork, no fork handlers); the
    agents, which spawn all the time, keep asyncio's own loop. tests/unit/test_spawning.py
    keeps the rule."""
    return uvloop.run(main)


async def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Runs `argv` to its end (killed after `timeout_s`: TimeoutError), its output captured,
    off the loop, spawned by CPython's subprocess (see run_loop)."""

    def run() -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{argv[0]} took over {timeout_s:.0f}s") from None

    return await asyncio.to_thread(run)


def exit_now(code: int) -> NoReturn:
    """Flushes and exits without interpreter finalization.

    The gRPC core's threads can abort a finalizing interpreter ("PyGILState_Release: thread
    state must be current when releasing"), which turns a clean exit into status 134. Every
    resource is closed before this is called; only finalization is skipped.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
