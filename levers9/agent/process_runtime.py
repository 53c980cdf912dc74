"""The process runtime: a task's command runs as a child process of the agent.

Each task runs in its own session, so its whole process group can be signalled (CancelTask and
shutdown: SIGTERM, then SIGKILL); like a container, it ends when its main process ends, and what
it left behind in its group is killed then. stdin is closed; stdout and stderr are merged in the
order they were written.

Each running task's pid and start time are kept in a small JSON under the runtime's state dir
(when it has one): a process outlives an agent that is SIGKILLed (its own session), and its exit
status goes with that agent, so the agent started after it kills it (`sweep`) and reports its
task lost.

The environment is built from scratch, not inherited: the agent's own holds the worker token,
which a task must never see. A task gets a few neutral variables of the agent's (PATH, HOME,
locale), its own env, then what the worker decides: its cards, the driver on PATH and
LD_LIBRARY_PATH, and `LEVERS9_RESULT_PATH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from levers9.agent.driver import DriverSetup
from levers9.agent.runtime import (
    Container,
    ContainerSpec,
    StartError,
    drain,
    exec_stdio,
    prepend_path,
    pump_output,
    visible_devices,
)

HOST = "process"
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL")


class ProcessContainer:
    """One running task process."""

    host = HOST
    image = None
    oom_killed = False
    limit_hit = ""
    storage_error = ""
    lost = ""
    netns: Path | None = None
    dialer = None

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        pump: asyncio.Task[None],
        env: Mapping[str, str],
        cwd: Path,
        record: Path | None = None,
    ) -> None:
        self._process = process
        self._pump = pump
        self._record = record
        self.env = dict(env)
        self.cwd = cwd

    async def wait(self) -> int:
        code = await self._process.wait()
        _kill_group(self._process.pid, signal.SIGKILL)
        await drain(self._pump)
        if self._record is not None:
            self._record.unlink(missing_ok=True)
        return 128 - code if code < 0 else code

    async def stop(self, grace_s: float) -> int:
        if self._process.returncode is None:
            _kill_group(self._process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), max(grace_s, 0))
            except TimeoutError:
                _kill_group(self._process.pid, signal.SIGKILL)
        return await self.wait()


class ProcessRuntime:
    """Runs tasks as local processes (see module doc)."""

    def __init__(
        self, driver: DriverSetup, agent_env: Mapping[str, str], state_dir: Path | None = None
    ) -> None:
        """`state_dir`: where each running task's pid is kept (see the module's docstring)."""
        self._driver = driver
        self._base = {k: agent_env[k] for k in INHERITED if k in agent_env}
        self._state = state_dir
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def host(self) -> str:
        return HOST

    def host_for(self, image: str, runtime: str = "") -> str:
        return HOST

    def environment(self, spec: ContainerSpec) -> dict[str, str]:
        env = {**self._base, **spec.env}
        env["PATH"] = prepend_path(env.get("PATH"), self._driver.bin_dirs)
        if self._driver.library_path:
            env["LD_LIBRARY_PATH"] = prepend_path(
                env.get("LD_LIBRARY_PATH"), self._driver.library_path
            )
        cards = ",".join(str(i) for i in spec.gpu_indices)
        env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(spec.gpu_indices)
        # A process sees every card of the node, so CUDA is told which; in PCI bus order,
        # the order of nvidia-smi's indices that the assignment speaks in.
        env["CUDA_VISIBLE_DEVICES"] = cards
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["LEVERS9_RESULT_PATH"] = str(spec.result_path)
        env["LEVERS9_TASK_ID"] = spec.task_id
        return env

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        if not spec.command:
            raise StartError("the task has no command")
        if spec.mounts:
            raise StartError(
                "volumes and disks are mounted into containers only: run the task with an image"
            )
        env = self.environment(spec)
        spec.work_dir.mkdir(parents=True, exist_ok=True)
        spec.result_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                env=env,
                cwd=spec.work_dir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:
            raise StartError(str(error)) from None
        assert process.stdout is not None
        pump = pump_output(process.stdout, output)
        record = None
        if self._state is not None:
            # Named by a digest: a task id is the controlplane's, whatever it holds.
            name = hashlib.sha256(spec.task_id.encode()).hexdigest()[:16]
            record = self._state / f"{name}.json"
            kept = {"task_id": spec.task_id, "pid": process.pid, "start": start_ticks(process.pid)}
            record.write_text(json.dumps(kept))
        return ProcessContainer(process, pump, env, spec.work_dir, record)

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        if not isinstance(container, ProcessContainer):
            raise StartError("not a container of the process runtime")
        if not command:
            raise StartError("exec needs a command")
        try:
            return await asyncio.create_subprocess_exec(
                *command,
                env=container.env,
                cwd=container.cwd,
                **exec_stdio(terminal),
                start_new_session=True,
            )
        except OSError as error:
            raise StartError(str(error)) from None

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        """None: a process's exit status went with the agent that was its parent."""
        return None

    async def sweep(self, keep: Collection[str]) -> list[str]:
        """Kills the process group of every task an agent before this one left running."""
        swept: list[str] = []
        for record in sorted(self._state.glob("*.json")) if self._state is not None else ():
            try:
                kept = json.loads(record.read_text())
                task_id, pid, start = str(kept["task_id"]), int(kept["pid"]), int(kept["start"])
            except (OSError, ValueError, KeyError, TypeError):
                record.unlink(missing_ok=True)
                continue
            if task_id in keep:
                continue
            if start_ticks(pid) == start:
                _kill_group(pid, signal.SIGKILL)
            record.unlink(missing_ok=True)
            swept.append(task_id)
        return swept


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (a pid is the same process while it
    matches); None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
