"""Checkpoint and restore with the real runsc (gVisor, Debian's 2022 build, ptrace platform): a
counting task is checkpointed (its image sealed with a manifest of checksums), restored as a new
task from it and counts on from where it was (its /tmp, gVisor's own tmpfs, and its writable
layer both carried); an image with one byte flipped is refused at restore naming the file; a
checkpoint of a runc task is refused naming CRIU's `criu check`; a checkpoint whose image
would not fit (this gVisor's save that fails midway ends the sandbox) is refused before it
starts and the task counts on, no image or staging folder left; DeleteCheckpoint removes an
image, and a restore from it is then refused as from a missing one. Root only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from levers9.agent import checkpoints
from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.runtime import ContainerSpec, StartError
from levers9.agent.supervisor import TaskManager
from levers9.agent.task_errors import InvalidTask, PortUnavailable
from levers9.agent.task_record import CONTAINER_READY
from levers9.proto import worker_pb2
from sandbox.registries import LocalRegistry
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runsc needs root (CI and the worker Job are)"),
    pytest.mark.skipif(shutil.which("runsc") is None, reason="deploy/dev/install-tools.sh"),
]

COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; echo $i > /work/layer-count;"
    " echo $i; sleep 0.2; done"
)


def _runtime(
    cls: type[RuncRuntime], image: tuple[LocalRegistry, str], tmp_path: Path
) -> RuncRuntime:
    return cls(
        ImageCache(tmp_path / "images", insecure=[image[0].address]),
        tmp_path / "work" / cls.host,
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
        limits=Limits(memory_bytes=256 * 1024**2, pids=256),
    )


@pytest.fixture
def runtime(image: tuple[LocalRegistry, str], tmp_path: Path) -> RuncRuntime:
    return _runtime(RunscRuntime, image, tmp_path)


def _spec(tmp_path: Path, image: str, *command: str, name: str) -> ContainerSpec:
    task = tmp_path / "tasks" / name
    return ContainerSpec(
        # Unique: a gVisor sandbox's control socket is named by its container's id, machine-wide.
        task_id=f"{name}-{uuid.uuid4().hex[:8]}",
        image=image,
        command=command,
        env={},
        gpu_indices=(),
        result_path=task / "result.json",
        work_dir=task / "work",
    )


async def _read(runtime: RuncRuntime, container: RuncContainer, *command: str) -> str:
    process = await runtime.exec(container, command)
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    return out.decode().strip()


async def _count(runtime: RuncRuntime, container: RuncContainer) -> int:
    said = await _read(runtime, container, "cat", "/tmp/count")
    return int(said) if said.isdigit() else 0


async def _counting(runtime: RuncRuntime, container: RuncContainer, above: int) -> int:
    seen = 0

    async def counted() -> bool:
        nonlocal seen
        seen = await _count(runtime, container)
        return seen > above

    await eventually(counted, 30, what="the counter counts")
    return seen


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    """A 100 KiB tmpfs: a checkpoint image cannot fit in it."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


async def test_a_counter_is_checkpointed_and_restored_counting_on(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    out = bytearray()
    container = await runtime.start(
        _spec(tmp_path, image[1], "sh", "-c", COUNTER, name="c1"), out.extend
    )
    assert isinstance(container, RuncContainer)
    await _counting(runtime, container, 5)
    path = checkpoints.image_path(tmp_path / "checkpoints", "team-a", "counter")
    size = await container.checkpoint(path, {"task_id": "c1"})
    await asyncio.wait_for(container.wait(), 30)
    assert size > 0
    manifest = json.loads((path / checkpoints.MANIFEST).read_text())["files"]
    assert "layer/work/layer-count" in manifest
    assert checkpoints.META in manifest
    assert any(name.startswith("state/") for name in manifest)
    assert [p.name for p in path.parent.iterdir()] == ["counter"], "no staging folder is left"
    before = int((path / "layer" / "work" / "layer-count").read_text())
    assert before > 5

    restored_out = bytearray()
    spec = dataclasses.replace(
        _spec(tmp_path, image[1], "sh", "-c", COUNTER, name="c2"), restore_from=path
    )
    restored = await runtime.start(spec, restored_out.extend)
    assert isinstance(restored, RuncContainer)
    try:
        now = await _counting(runtime, restored, before)
        assert now > before
        layer = int(await _read(runtime, restored, "cat", "/work/layer-count"))
        assert layer >= before, "its writable layer came with it"

        async def printing() -> bool:
            return bool(restored_out.strip())

        await eventually(printing, 30, what="the restored task prints")
        printed = [int(x) for x in restored_out.decode().split()]
        assert min(printed) > before - 2, restored_out.decode()
    finally:
        await asyncio.wait_for(restored.stop(grace_s=1), 30)


async def test_a_corrupted_image_is_refused_at_restore(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    container = await runtime.start(
        _spec(tmp_path, image[1], "sh", "-c", COUNTER, name="d1"), lambda _: None
    )
    assert isinstance(container, RuncContainer)
    await _counting(runtime, container, 1)
    path = tmp_path / "checkpoints" / "team-a" / "flipped"
    await container.checkpoint(path, {"task_id": "d1"})
    await asyncio.wait_for(container.wait(), 30)
    biggest = max(
        (p for p in (path / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
    spec = dataclasses.replace(_spec(tmp_path, image[1], "true", name="d2"), restore_from=path)
    with pytest.raises(StartError, match="does not match its checksum") as refused:
        await runtime.start(spec, lambda _: None)
    assert str(biggest.relative_to(path)) in str(refused.value)
    with pytest.raises(StartError, match="no checkpoint missing"):
        await runtime.start(
            dataclasses.replace(spec, restore_from=path.parent / "missing"), lambda _: None
        )


async def test_a_runc_task_is_refused_naming_criu(
    image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    runc = _runtime(RuncRuntime, image, tmp_path)
    container = await runc.start(
        _spec(tmp_path, image[1], "sleep", "60", name="r1"), lambda _: None
    )
    assert isinstance(container, RuncContainer)
    path = tmp_path / "checkpoints" / "team-a" / "r"
    try:
        with pytest.raises(checkpoints.CheckpointRefused, match="criu check") as refused:
            await container.checkpoint(path, {})
        assert "--runtime runsc" in str(refused.value)
        assert not container.exited, "the task runs on"
        assert not path.parent.exists() or list(path.parent.iterdir()) == []
    finally:
        await asyncio.wait_for(container.stop(grace_s=1), 30)


async def test_a_checkpoint_without_room_is_refused_and_the_task_runs_on(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path, tiny: Path
) -> None:
    container = await runtime.start(
        _spec(tmp_path, image[1], "sh", "-c", COUNTER, name="f1"), lambda _: None
    )
    assert isinstance(container, RuncContainer)
    try:
        seen = await _counting(runtime, container, 1)
        with pytest.raises(checkpoints.CheckpointRefused, match=r"not enough room.*runs on"):
            await container.checkpoint(tiny / "team-a" / "full", {})
        assert list((tiny / "team-a").iterdir()) == [], "no image, no staging folder"
        assert not container.exited
        await _counting(runtime, container, seen + 2)
    finally:
        await asyncio.wait_for(container.stop(grace_s=1), 30)


async def test_the_worker_checkpoints_a_task_and_runs_its_restore(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    """TaskManager (what WorkerService.CheckpointTask and RunTask call): the task ends CANCELLED
    `checkpointed to NAME`, its image under the checkpoints root's workspace folder; a TaskSpec
    with restore_from NAME counts on; one naming a missing checkpoint fails saying so."""
    reports: list[worker_pb2.TaskStatus] = []
    tasks = TaskManager(
        runtime, (), tmp_path / "agent", reports.append, checkpoints_root=tmp_path / "ck"
    )
    first = f"w1-{uuid.uuid4().hex[:8]}"
    spec = worker_pb2.TaskSpec(
        task_id=first, image=image[1], command=["sh", "-c", COUNTER], workspace="team-a"
    )
    await tasks.run(spec)

    async def counted_past(task_id: str, above: int) -> int:
        seen = 0

        async def check() -> bool:
            nonlocal seen
            said = bytes(tasks.output(task_id).read(0, 1 << 20)).split()
            seen = int(said[-1]) if said and said[-1].isdigit() else 0
            return seen > above

        await eventually(check, 30, what=f"{task_id} counts past {above}")
        return seen

    await counted_past(first, 3)
    answer = await tasks.checkpoint(first, "box-1")
    assert answer.path == str(tmp_path / "ck" / "team-a" / "box-1")
    assert answer.size_bytes > 0
    ended = tasks.status(first)
    assert ended.state == worker_pb2.TASK_STATE_CANCELLED
    assert ended.reason == "checkpointed to box-1"
    before = int((Path(answer.path) / "layer" / "work" / "layer-count").read_text())
    with pytest.raises(checkpoints.CheckpointRefused, match="not running"):
        await tasks.checkpoint(first, "box-2")

    second = f"w2-{uuid.uuid4().hex[:8]}"
    restore = worker_pb2.TaskSpec(
        task_id=second,
        image=image[1],
        command=["sh", "-c", COUNTER],
        workspace="team-a",
        restore_from="box-1",
    )
    await tasks.run(restore)
    try:
        assert await counted_past(second, before) > before
        first_printed = int(bytes(tasks.output(second).read(0, 1 << 20)).split()[0])
        assert first_printed > before - 2, "it went on from where it was, not from 1"
    finally:
        await tasks.cancel(second)
    missing = worker_pb2.TaskSpec(
        task_id=f"w3-{uuid.uuid4().hex[:8]}",
        image=image[1],
        command=["true"],
        workspace="team-a",
        restore_from="nope",
    )
    await tasks.run(missing)
    status = tasks.status(missing.task_id)
    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert "no checkpoint nope on this machine" in status.reason

    # DeleteCheckpoint (`box delete`): the image goes, nothing of it is left beside it, and a
    # restore from it is refused as a missing one.
    assert await tasks.delete_checkpoint("team-a", "box-1") is True
    assert sorted(p.name for p in (tmp_path / "ck" / "team-a").iterdir()) == []
    assert await tasks.delete_checkpoint("team-a", "box-1") is False
    with pytest.raises(checkpoints.ImageInvalid, match="checkpoint name"):
        await tasks.delete_checkpoint("team-a", "../box-1")
    gone = worker_pb2.TaskSpec(
        task_id=f"w4-{uuid.uuid4().hex[:8]}",
        image=image[1],
        command=["true"],
        workspace="team-a",
        restore_from="box-1",
    )
    await tasks.run(gone)
    assert "no checkpoint box-1 on this machine" in tasks.status(gone.task_id).reason


SERVE_AND_COUNT = (
    "mkdir -p /tmp/www && echo served > /tmp/www/index.html"
    " && busybox httpd -p 127.0.0.1:$PORT -h /tmp/www && " + COUNTER
)
"""A web server on its port (busybox httpd answers HTTP/1.0 and closes first: the connection
this gVisor's save refuses while it lingers, were it not a loopback one) and a counter."""


async def _get(tasks: TaskManager, task_id: str, port: int) -> str:
    reader, writer = await tasks.connect(task_id, port)
    try:
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    return answer.decode().rsplit("\r\n\r\n", 1)[-1].strip()


async def test_a_served_port_answers_through_the_relay_and_survives_a_checkpoint_right_after(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    """A runsc task's published port is reached through the relay inside its sandbox (ready,
    then a GET answers); a checkpoint taken at once after a request succeeds (the server's
    side of that connection is a loopback one, which gVisor saves); the restored task answers
    on its port and counts on. A port nothing listens on is refused as nothing accepting."""
    reports: list[worker_pb2.TaskStatus] = []
    tasks = TaskManager(
        runtime, (), tmp_path / "agent", reports.append, checkpoints_root=tmp_path / "ck"
    )
    port = 8080

    def spec(task_id: str, restore_from: str = "") -> worker_pb2.TaskSpec:
        return worker_pb2.TaskSpec(
            task_id=task_id,
            image=image[1],
            command=["sh", "-c", SERVE_AND_COUNT],
            workspace="team-a",
            ports=[port],
            restore_from=restore_from,
        )

    def ready(task_id: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return CONTAINER_READY in [p.name for p in tasks.status(task_id).phases]

        return check

    def count(task_id: str) -> int:
        said = bytes(tasks.output(task_id).read(0, 1 << 20)).split()
        return int(said[-1]) if said and said[-1].isdigit() else 0

    first = f"s1-{uuid.uuid4().hex[:8]}"
    await tasks.run(spec(first))
    await eventually(ready(first), 30, what="its port is ready")
    assert await _get(tasks, first, port) == "served"
    with pytest.raises(InvalidTask, match="did not publish port 9"):
        await tasks.connect(first, 9)
    answer = await tasks.checkpoint(first, "served")
    assert tasks.status(first).reason == "checkpointed to served"
    before = int((Path(answer.path) / "layer" / "work" / "layer-count").read_text())

    second = f"s2-{uuid.uuid4().hex[:8]}"
    await tasks.run(spec(second, restore_from="served"))
    try:

        async def counted_on() -> bool:
            return count(second) > before

        await eventually(counted_on, 30, what="the restore counts on")
        first_printed = int(bytes(tasks.output(second).read(0, 1 << 20)).split()[0])
        assert first_printed > before - 2, "it went on from where it was, not from 1"
        await eventually(ready(second), 30, what="the restore's port is ready")
        assert await _get(tasks, second, port) == "served"
    finally:
        await tasks.cancel(second)


async def test_a_port_nothing_listens_on_is_refused_by_the_relay(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    tasks = TaskManager(runtime, (), tmp_path / "agent", lambda _: None)
    task_id = f"q-{uuid.uuid4().hex[:8]}"
    await tasks.run(
        worker_pb2.TaskSpec(task_id=task_id, image=image[1], command=["sleep", "600"], ports=[8081])
    )
    try:

        async def running() -> bool:
            return tasks.status(task_id).state == worker_pb2.TASK_STATE_RUNNING

        await eventually(running, 30)
        with pytest.raises(PortUnavailable, match="nothing listens on port 8081 in the sandbox"):
            await tasks.connect(task_id, 8081)
    finally:
        await tasks.cancel(task_id)
