"""A task that names no image on a pool without `taskDefaults.image` runs in a container of the
worker's own image, never as a process of the agent: the sandbox's worker image (built on the
Python task image, sandbox/worker_image.py) pulled from a real registry and run under the real
runc, the task's command as given (never the image's Entrypoint, `levers9-worker`, the agent).
Root only (runc).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.agent.images import ImageCache
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import TaskDefaults
from levers9.agent.supervisor import TaskManager
from levers9.proto import worker_pb2
from sandbox import task_images, worker_image
from sandbox.cluster.kubelet import make_device_nodes
from sandbox.registries import LocalRegistry, push_layout
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]
ENDED = (worker_pb2.TASK_STATE_SUCCEEDED, worker_pb2.TASK_STATE_FAILED)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, str]]:
    """A registry on 127.0.0.1 holding the dev stack's worker image; its reference."""
    base, _ = task_images.python_image()
    layout = worker_image.build(tmp_path_factory.mktemp("build") / "worker", base=base).layout
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as registry:
        reference = f"{registry.address}/{worker_image.REPOSITORY}:{worker_image.TAG}"
        push_layout(layout, reference, worker_image.TAG)
        yield registry, reference


@pytest.fixture
async def tasks(
    worker: tuple[LocalRegistry, str], tmp_path: Path
) -> tuple[TaskManager, list[worker_pb2.TaskStatus]]:
    registry, reference = worker
    make_device_nodes(tmp_path / "dev", 0)
    (tmp_path / "nvidia" / "lib64").mkdir(parents=True)
    runtime = RuncRuntime(
        ImageCache(tmp_path / "images", insecure=[registry.address]),
        tmp_path / "runc",
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
    )
    reports: list[worker_pb2.TaskStatus] = []
    defaults = TaskDefaults(image=reference, worker_image=reference)
    return TaskManager(runtime, (), tmp_path / "work", reports.append, defaults=defaults), reports


async def _ended(
    tasks: tuple[TaskManager, list[worker_pb2.TaskStatus]], task_id: str, *command: str
) -> worker_pb2.TaskStatus:
    manager, reports = tasks
    await manager.run(worker_pb2.TaskSpec(task_id=task_id, command=list(command)))

    def done() -> list[worker_pb2.TaskStatus]:
        return [r for r in reports if r.task_id == task_id and r.state in ENDED]

    async def ended() -> bool:
        return bool(done())

    await eventually(ended, within=90)
    [status] = done()
    return status


async def test_a_task_without_an_image_runs_its_command_in_the_workers_image(
    tasks: tuple[TaskManager, list[worker_pb2.TaskStatus]], worker: tuple[LocalRegistry, str]
) -> None:
    script = "import os, sys; print('python', sys.version_info[:2], os.getpid())"
    status = await _ended(tasks, "in-worker-image", "python3", "-c", script)
    assert (status.state, status.host, status.image) == (
        worker_pb2.TASK_STATE_SUCCEEDED,
        "runc",
        worker[1],
    ), status.reason
    assert status.log_tail == "python (3, 11) 1\n", "Debian's Python, PID 1 of its namespace"
    shell = await _ended(tasks, "shell", "sh", "-c", "sleep 0.1; echo $0 ran")
    assert (shell.state, shell.log_tail) == (worker_pb2.TASK_STATE_SUCCEEDED, "sh ran\n")


async def test_the_stand_in_worker_image_is_reproducible_on_its_base(tmp_path: Path) -> None:
    base, _ = await asyncio.to_thread(task_images.python_image)
    one = worker_image.build(tmp_path / "one", base=base)
    assert worker_image.build(tmp_path / "two", base=base).digest == one.digest
    assert worker_image.build(tmp_path / "bare").digest != one.digest
