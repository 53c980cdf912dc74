"""The runsc runtime (`host: "runsc"`): each task in a gVisor sandbox, a kernel of its own in
user space between the task and the node's.

Everything but the runtime binary is the runc runtime's (levers9.agent.runc_runtime): the image
cache, the overlay bundle, the OCI config (levers9.agent.runc_config), the shim and its record,
adoption and the sweep. runsc speaks runc's command line; what differs is here:

- its global flags: `--platform=ptrace` (the platform every kernel has: systrap needs a newer
  gVisor than Debian's 2022 build, kvm needs /dev/kvm), `--network=none` (the sandbox has only
  its loopback: until a task has a network namespace of its own, none at all);
- no `run --keep` (runsc has none): its cgroup goes with the sandbox, so an OOM kill is seen as
  the kill (exit 137), not named `OOMKilled`;
- what it cannot give a task, refused at start with the fix: cards (GPUs need gVisor's nvproxy,
  which this build lacks) and published ports (nothing outside the sandbox can dial into it);
- `exec` with a terminal: runsc has no `--tty`; the command's process JSON (the container's
  own, its args replaced) says `terminal: true` and the agent's terminal is handed in as its
  stdio, which the sandbox's kernel drives (its size, its line discipline).
"""

from __future__ import annotations

import asyncio
import json
import tty as termios_tty
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from levers9.agent.images import ImageCache
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import Container, ContainerSpec, StartError, exec_stdio

HOST = "runsc"
PLATFORM = "ptrace"
NETWORK = "none"
NO_GPUS = (
    "runsc (gVisor) on this worker cannot give a task GPUs: its gVisor has no nvproxy; run it"
    " with --runtime runc, or install a gVisor with nvproxy (release 20230605 or later) in the"
    " worker image"
)
NO_PORTS = (
    "runsc (gVisor) on this worker cannot publish a task's ports: its sandbox has no network"
    " the agent can dial (--network=none); run it with --runtime runc"
)


class RunscRuntime(RuncRuntime):
    """Runs tasks in gVisor sandboxes (see the module's docstring)."""

    host = HOST
    RUN_FLAGS = ()
    USER_NAMESPACE = False
    """gVisor's own kernel stands between the task and the node's; this runsc (2022) refuses
    to join a user namespace by path (`gofer: error setting namespace of type user`)."""
    VOLUME_BACKEND = "s3fs"
    """Its gofer serves a volume's FUSE mount: files it creates through rclone 1.60's mount fail
    with EIO, through s3fs's they are made (tests/agent/test_storage.py)."""

    def __init__(self, images: ImageCache, state_dir: Path, **options: Any) -> None:
        """RuncRuntime's, with no cards (NO_GPUS) and runsc as its binary unless `runc` names
        another."""
        super().__init__(images, state_dir, **{"runc": "runsc", **options, "cards": ()})

    def _runc_argv(self, *args: str) -> list[str]:
        """`runsc --root <state> --platform=ptrace --network=none ARGS`."""
        root = super()._runc_argv()
        return [*root, f"--platform={PLATFORM}", f"--network={NETWORK}", *args]

    def _refuse(self, spec: ContainerSpec) -> str | None:
        if spec.gpu_indices:
            return NO_GPUS
        if spec.ports:
            return NO_PORTS
        return super()._refuse(spec)

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        """`runsc exec`; with `terminal`, the container's process JSON with its args replaced
        and `terminal: true`, the terminal given as its stdio."""
        if terminal is None or not isinstance(container, RuncContainer) or not command:
            return await super().exec(container, command, terminal)
        config = json.loads((container.bundle / "config.json").read_text())
        process = {**config["process"], "args": list(command), "terminal": True}
        path = container.bundle / f"exec-{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(process))
        # The sandbox's terminal does the line discipline; this one only relays (see runc's).
        termios_tty.setraw(terminal)
        try:
            return await asyncio.create_subprocess_exec(
                *self._runc_argv("exec", "--process", str(path), container.id),
                **exec_stdio(terminal),
                start_new_session=True,
            )
        except FileNotFoundError:
            raise StartError(f"{self._runc} is not installed on this worker") from None
