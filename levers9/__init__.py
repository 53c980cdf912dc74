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

import importlib as _importlib
import os as _os
import sys as _sys
from collections.abc import Sequence as _Sequence
from importlib import abc as _abc
from importlib import machinery as _machinery
from importlib import util as _util
from types import ModuleType as _ModuleType

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"

GRPC_TUNED = "GRPC_EXPERIMENTS" in _os.environ or "grpc._cython.cygrpc" not in _sys.modules
"""Whether `GRPC_EXPERIMENTS` reached this process's gRPC core in time (or the environment set
its own)."""

_os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


class _AgentByItsOldName(_abc.MetaPathFinder, _abc.Loader):
    """`levers9.worker[.X]` is `levers9.agent[.X]`, the same module objects: the agent's package
    was `levers9/worker/` until the layout named it for what it is, and the GPU check on the
    device machines (shared/gpu/harness.py, which this repository does not own) imports it by
    that name. Nothing in this repository does (.importlinter)."""

    OLD, NEW = "levers9.worker", "levers9.agent"

    def __init__(self) -> None:
        self._specs: dict[int, _machinery.ModuleSpec | None] = {}

    def find_spec(
        self,
        fullname: str,
        path: _Sequence[str] | None,
        target: _ModuleType | None = None,
    ) -> _machinery.ModuleSpec | None:
        if fullname != self.OLD and not fullname.startswith(self.OLD + "."):
            return None
        return _util.spec_from_loader(fullname, self)

    def create_module(self, spec: _machinery.ModuleSpec) -> _ModuleType:
        module = _importlib.import_module(self.NEW + spec.name[len(self.OLD) :])
        self._specs[id(module)] = module.__spec__
        return module

    def exec_module(self, module: _ModuleType) -> None:
        # The import system gave the module this alias's spec: its own comes back (its name,
        # its file), so that it is one module under two names, not a module of the old name.
        module.__spec__ = self._specs.pop(id(module), module.__spec__)


_sys.meta_path.insert(0, _AgentByItsOldName())
