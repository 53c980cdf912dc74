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

from levers9 import GRPC_FORK_HANDLERS_OFF

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T], *, spawns: bool = False) -> T:
    """Runs `main` on uvloop: its sockets and TLS took about a fifth off the endpoints' warm
    proxy overhead in the controlplane (its front, port-forward, logs and exec relays), and as
    much again in the worker agent that carries the same streams (benchmarks/README.md).

    libuv spawns by forking, and a child forked while another thread is inside gRPC crashed in
    the gRPC core's fork handlers before its exec. A process that spawns through its loop
    (`spawns`: the agents run runc, exec and skopeo all the time) therefore runs on uvloop only
    when those handlers are off (`levers9.GRPC_FORK_HANDLERS_OFF`: the agents' entry points
    import levers9 before grpc), else on asyncio's loop, whose spawns go through CPython's
    subprocess (vfork, no fork handlers), saying so. The controlplane (`worker_main`, where
    temporalio brings grpc in first) never spawns through its loop: `run_command` below, and
    tests/unit/test_spawning.py keeps the rule."""
    if spawns and not GRPC_FORK_HANDLERS_OFF:
        from levers9.logs import get_logger  # here: the CLI imports this module, not logging

        get_logger(__name__).warning(
            "running on asyncio's loop, not uvloop: gRPC's fork handlers are on",
            fix="GRPC_ENABLE_FORK_SUPPORT=false, and import levers9 before grpc",
        )
        return asyncio.run(main)
    return uvloop.run(main)


async def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Runs `argv` to its end (killed after `timeout_s`: TimeoutError), its output captured,
    off the loop, spawned by CPython's subprocess (see run_loop): how the controlplane spawns."""

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
