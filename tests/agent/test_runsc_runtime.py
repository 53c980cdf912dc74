"""The runsc runtime with the real runsc (gVisor, Debian's 2022 build), umoci and skopeo and a real
registry: a task runs in its image inside gVisor's kernel (its dmesg is gVisor's boot), its
output and result reach the agent, `exec` runs inside it with and without a terminal, stop ends
it, a task asking for cards or ports is refused naming the fix, its sandbox is annotated with
its task, workspace and pool (`runsc state`), and a worker holding both runtimes sweeps each
one's containers with its own binary. Root only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import pty
import shutil
import struct
import termios
from pathlib import Path

import pytest

from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runsc_runtime import NO_GPUS, NO_PORTS, RunscRuntime
from levers9.agent.runtime import ContainerSpec, StartError
from sandbox.registries import LocalRegistry

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runsc needs root (CI and the worker Job are)"),
    pytest.mark.skipif(shutil.which("runsc") is None, reason="deploy/dev/install-tools.sh"),
]


def _cache(image: tuple[LocalRegistry, str], tmp_path: Path) -> ImageCache:
    return ImageCache(tmp_path / "images", insecure=[image[0].address])


@pytest.fixture
def runtime(image: tuple[LocalRegistry, str], tmp_path: Path) -> RunscRuntime:
    return RunscRuntime(
        _cache(image, tmp_path),
        tmp_path / "work" / "runsc",
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
        limits=Limits(memory_bytes=256 * 1024**2, pids=256),
    )


T = f"t{os.getpid()}"
"""The default task id: gVisor names a sandbox's control socket by container id across the
whole machine, so two runs at once (two test workers, two checkouts) must not share one."""


def _spec(tmp_path: Path, image: str, *command: str, name: str = T) -> ContainerSpec:
    task = tmp_path / "tasks" / name
    return ContainerSpec(
        task_id=name,
        image=image,
        command=command,
        env={"TASK_VAR": "mine"},
        gpu_indices=(),
        result_path=task / "result.json",
        work_dir=task / "work",
    )


async def _run(runtime: RuncRuntime, spec: ContainerSpec) -> tuple[int, str]:
    out = bytearray()
    container = await runtime.start(spec, out.extend)
    assert container.host == runtime.host
    code = await asyncio.wait_for(container.wait(), 60)
    return code, out.decode()


async def _listed(binary: str, root: Path) -> list[str]:
    listed = await asyncio.create_subprocess_exec(
        binary, "--root", str(root), "list", "--format", "json", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await listed.communicate()
    return [str(e["id"]) for e in json.loads(out or b"null") or []]


async def test_the_task_runs_on_gvisors_kernel_in_its_image(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    code, out = await _run(runtime, _spec(tmp_path, image[1], "busybox", "dmesg"))
    assert code == 0
    assert "Starting gVisor..." in out, out
    script = 'id -u; pwd; echo "$IMAGE_GREETING $TASK_VAR"; cat /etc/levers9-marker; exit 3'
    code, out = await _run(
        runtime, _spec(tmp_path, image[1], "sh", "-c", script, name=f"u{os.getpid()}")
    )
    assert code == 3
    assert out.splitlines() == ["1000", "/work", "hello mine", "runc"]


async def test_the_result_file_reaches_the_agent(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = _spec(tmp_path, image[1], "sh", "-c", 'echo \'{"ok": true}\' > "$LEVERS9_RESULT_PATH"')
    assert await _run(runtime, spec) == (0, "")
    assert spec.result_path.read_text() == '{"ok": true}\n'


async def test_exec_with_and_without_a_terminal_then_stop(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    container = await runtime.start(_spec(tmp_path, image[1], "sleep", "60"), lambda _: None)
    assert isinstance(container, RuncContainer)
    try:
        process = await runtime.exec(container, ["sh", "-c", "busybox dmesg | head -1; ps"])
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0
        assert b"Starting gVisor..." in out
        assert b"sleep 60" in out, "the exec runs beside the task, in its sandbox"
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        try:
            shell = await runtime.exec(container, ["sh", "-c", "stty size; exit 4"], follower)
            os.close(follower)
            assert await asyncio.wait_for(shell.wait(), 30) == 4
            said = await asyncio.to_thread(os.read, leader, 4096)
            assert said.split() == [b"33", b"101"], "the terminal is the exec's, its size read"
        finally:
            os.close(leader)
    finally:
        code = await asyncio.wait_for(container.stop(grace_s=1), 30)
    assert code in (128 + 15, 128 + 9)
    assert await _listed("runsc", tmp_path / "work" / "runsc") == []


async def test_its_sandbox_is_annotated_with_its_task_workspace_and_pool(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = dataclasses.replace(
        _spec(tmp_path, image[1], "sleep", "60", name=f"annotated{os.getpid()}"),
        workspace="team-a",
        pool="p",
    )
    container = await runtime.start(spec, lambda _: None)
    assert isinstance(container, RuncContainer)
    try:
        shown = await asyncio.create_subprocess_exec(
            *runtime._runc_argv("state", container.id), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await shown.communicate()
        annotations = json.loads(out)["annotations"]
    finally:
        await asyncio.wait_for(container.stop(grace_s=1), 30)
    assert {k: v for k, v in annotations.items() if k.startswith("levers9.")} == {
        "levers9.task": f"annotated{os.getpid()}",
        "levers9.workspace": "team-a",
        "levers9.pool": "p",
    }


@pytest.mark.parametrize(
    ("cards", "ports", "relay", "refused"),
    [((0,), (), "/bin/busybox", NO_GPUS), ((), (8000,), "/usr/bin/env", NO_PORTS)],
)
async def test_what_gvisor_cannot_give_is_refused_naming_the_fix(
    image: tuple[LocalRegistry, str],
    tmp_path: Path,
    cards: tuple[int, ...],
    ports: tuple[int, ...],
    relay: str,
    refused: str,
) -> None:
    """Cards, and ports on a worker whose relay binary is not static (here: env, which needs
    the node's libc)."""
    runtime = RunscRuntime(
        _cache(image, tmp_path),
        tmp_path / "work" / "runsc",
        relay=Path(relay),
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
    )
    spec = dataclasses.replace(_spec(tmp_path, image[1], "true"), gpu_indices=cards, ports=ports)
    with pytest.raises(StartError) as raised:
        await runtime.start(spec, lambda _: None)
    assert str(raised.value) == refused
    assert "--runtime runc" in refused


async def test_each_runtime_sweeps_only_its_own_containers(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    runc = RuncRuntime(
        _cache(image, tmp_path),
        tmp_path / "work" / "runc",
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
        cards=(),
    )
    started = await runtime.start(_spec(tmp_path, image[1], "sleep", "60"), lambda _: None)
    try:
        assert await runc.sweep(keep=()) == [], "runc leaves gVisor's sandbox alone"
        assert await runc.adopt(T, lambda _: None, 0) is None
        assert await _listed("runsc", tmp_path / "work" / "runsc") == [f"l9-{T}"]
        assert await runtime.sweep(keep=()) == [T]
        assert await _listed("runsc", tmp_path / "work" / "runsc") == []
        assert await asyncio.wait_for(started.wait(), 30) == 128 + 9
    finally:
        await started.stop(0)


SERVE = "echo adopted > /tmp/index.html && exec busybox httpd -f -p 127.0.0.1:8080 -h /tmp"


async def test_an_agent_started_after_this_one_adopts_its_sandbox(
    runtime: RunscRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    """Its exec, and its published port through the relay, work from the adopting agent."""
    spec = dataclasses.replace(_spec(tmp_path, image[1], "sh", "-c", SERVE), ports=(8080,))
    first = await runtime.start(spec, lambda _: None)
    # What an agent started on the same work dir builds (the first one SIGKILLed, say).
    again = RunscRuntime(_cache(image, tmp_path), tmp_path / "work" / "runsc")
    adopted = await again.adopt(T, lambda _: None, 0)
    try:
        assert adopted is not None
        assert adopted.host == "runsc"
        process = await again.exec(adopted, ["cat", "/etc/levers9-marker"])
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert (process.returncode, out) == (0, b"runc")
        assert adopted.dialer is not None, "its port is reached through the relay"
        answer = b""
        for _ in range(100):  # until httpd listens
            try:
                reader, writer = await adopted.dialer(8080)
            except ConnectionRefusedError:
                await asyncio.sleep(0.2)
                continue
            writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            break
        assert answer.endswith(b"adopted\n"), answer
    finally:
        code = await asyncio.wait_for((adopted or first).stop(grace_s=1), 30)
    assert code in (128 + 15, 128 + 9)
    await asyncio.wait_for(first.wait(), 30)
    assert await _listed("runsc", tmp_path / "work" / "runsc") == []
