"""levers9: the controlplane's Kubernetes provider pool, its worker and its CLI.

Importing it sets `GRPC_EXPERIMENTS` (unless the environment already does) for the process and
what it starts: the gRPC core's TCP then runs on its iomgr path rather than the newer event
engine, which reads each message on one of its own threads before the completion queue hands it
on. Measured here: a gRPC aio round trip 0.22-0.25 ms against 0.34-0.43 ms and a quarter less
CPU, and the endpoints' warm proxy overhead 12-14% lower at the same noise
(benchmarks/README.md, 2026-12-02). The core reads it when grpc is first imported: the agents
and the CLI import levers9 first; the controlplane (`worker_main`, where temporalio brings grpc
in first) has it from its image, or from `levers9 dev up`, which starts it.
"""

from __future__ import annotations

import os as _os
import sys as _sys

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"

GRPC_TUNED = "GRPC_EXPERIMENTS" in _os.environ or "grpc._cython.cygrpc" not in _sys.modules
"""Whether `GRPC_EXPERIMENTS` reached this process's gRPC core in time (or the environment set
its own)."""

_os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
