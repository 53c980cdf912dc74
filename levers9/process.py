"""Running and leaving a process that loaded the gRPC core (every one that imports temporalio
or grpc)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn


async def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Runs `argv` to its end (killed after `timeout_s`: TimeoutError), its output captured,
    in a thread, spawned by CPython's subprocess (vfork: no fork handlers run in the child).

    The controlplane ran on uvloop for a while, whose spawns fork; in a process running gRPC a
    child forked while another thread was inside gRPC could crash in the gRPC core's fork
    handlers before its exec (SIGSEGV or SIGABRT, "Check failed: next_worker->state ==
    KICKED"; 7 in 300 spawns under gRPC traffic here, none with GRPC_ENABLE_FORK_SUPPORT=false
    set before grpc was imported). uvloop was dropped when it measured no gain over asyncio's
    loop (benchmarks/README.md, 2026-12-02); spawning this way keeps that hazard away from
    whatever loop runs."""

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
