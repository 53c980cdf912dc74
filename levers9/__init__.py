"""levers9: the controlplane's Kubernetes provider pool, its worker and its CLI.

Imported first by every entry point in this package (the agents', the CLI's), this turns the
gRPC core's fork handlers off for the process, unless its environment already says otherwise:
the agents run on uvloop, whose spawns fork (libuv), and with the handlers on, a child forked
while another thread was inside gRPC crashed in them before its exec (SIGSEGV or SIGABRT,
"Check failed: next_worker->state == KICKED"; 6 children in a thousand spawns with gRPC
traffic). Nothing here forks to run gRPC in the child, which is all the handlers are for. The
core reads the setting when grpc is first imported, so `levers9.process.run_loop` checks that
it came in time (`GRPC_FORK_HANDLERS_OFF`).
"""

from __future__ import annotations

import os as _os
import sys as _sys

_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

GRPC_FORK_HANDLERS_OFF = (
    "grpc._cython.cygrpc" not in _sys.modules
    and _os.environ["GRPC_ENABLE_FORK_SUPPORT"] in ("false", "0")  # as the core reads it
)
"""Whether this process's gRPC core runs no fork handlers (so it can fork, then exec)."""
