"""Running and leaving a process that loaded the gRPC core (every one that imports temporalio
or grpc)."""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import uvloop

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Runs `main` on uvloop, as the long-running processes do (the controlplane, the worker
    agent, the cluster agent): their loops carry traffic (the endpoints' front, port-forward,
    the kube relay), and uvloop's sockets and TLS took a third off the endpoints' warm proxy
    overhead (benchmarks/README.md)."""
    return uvloop.run(main)


def exit_now(code: int) -> NoReturn:
    """Flushes and exits without interpreter finalization.

    The gRPC core's threads can abort a finalizing interpreter ("PyGILState_Release: thread
    state must be current when releasing"), which turns a clean exit into status 134. Every
    resource is closed before this is called; only finalization is skipped.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
