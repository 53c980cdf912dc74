"""Finished tasks are kept until the controlplane fetches them, then forgotten beyond a limit
(with their files), so a long-lived worker's memory and disk stay bounded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from levers9.agent.driver import DriverSetup
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.supervisor import TaskManager
from levers9.agent.task_errors import TaskNotFound
from levers9.proto import worker_pb2
from tests.agent.conftest import AGENT_ENV


@pytest.fixture
def tasks(tmp_path: Path) -> TaskManager:
    runtime = ProcessRuntime(DriverSetup((), (), ()), AGENT_ENV)
    return TaskManager(runtime, (), tmp_path / "work", lambda status: None, keep_finished=1)


async def _run_to_end(tasks: TaskManager, task_id: str) -> None:
    spec = worker_pb2.TaskSpec(task_id=task_id, command=[sys.executable, "-c", "pass"])
    await tasks.run(spec)
    async for _ in tasks.output(task_id).chunks(0, follow=True):
        pass  # returns once the task's output is closed, i.e. the task has ended


async def test_fetched_tasks_are_forgotten_beyond_the_limit(tasks: TaskManager) -> None:
    for task_id in ("a", "b"):
        await _run_to_end(tasks, task_id)
    # Not fetched yet: both kept.
    assert tasks.status("a").state == worker_pb2.TASK_STATE_SUCCEEDED
    assert tasks.status("b").state == worker_pb2.TASK_STATE_SUCCEEDED

    with pytest.raises(TaskNotFound):
        tasks.status("a")
    assert tasks.status("b").task_id == "b"


async def test_unfetched_tasks_are_kept_up_to_four_times_the_limit(tasks: TaskManager) -> None:
    for task_id in "abcde":
        await _run_to_end(tasks, task_id)

    with pytest.raises(TaskNotFound):
        tasks.output("a")
    for task_id in "bcde":
        tasks.output(task_id)  # still kept: nobody fetched them yet


async def test_a_task_without_an_image_gets_the_pools_default(tmp_path: Path) -> None:
    """The default is applied before the runtime is chosen: on a worker that cannot run images
    the task fails naming why, and its status names the default image it was to run in."""
    from levers9.agent.runtime import ByImage, TaskDefaults

    reports: list[worker_pb2.TaskStatus] = []
    process = ProcessRuntime(DriverSetup((), (), ()), AGENT_ENV)
    tasks = TaskManager(
        ByImage(process, None, "runc is not installed in the worker image"),
        (),
        tmp_path / "work",
        reports.append,
        defaults=TaskDefaults("us-docker.pkg.dev/p/r/torch:2.5", 2**30, 500),
    )
    await _run_to_end(tasks, "t-default")
    [status] = [r for r in reports if r.task_id == "t-default"]
    assert status.image == "us-docker.pkg.dev/p/r/torch:2.5"
    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert "runc is not installed in the worker image" in status.reason
    own = worker_pb2.TaskSpec(task_id="t-own", command=[sys.executable, "-c", "pass"])
    assert tasks._with_defaults(own).memory_bytes == 2**30
    own.memory_bytes = 5
    assert tasks._with_defaults(own).memory_bytes == 5, "the task's own limit wins"


async def test_a_later_attempt_runs_again_and_a_retried_run_task_never_does(
    tmp_path: Path,
) -> None:
    """`--retries`: the same task id comes back as attempt 2 once attempt 1 ended, and runs
    again (its status names the attempt); a RunTask of an attempt the worker has or had is
    answered `already` and runs nothing."""
    runtime = ProcessRuntime(DriverSetup((), (), ()), AGENT_ENV)
    tasks = TaskManager(runtime, (), tmp_path / "work", lambda status: None)
    marks = tmp_path / "runs"

    def attempt(number: int) -> worker_pb2.TaskSpec:
        script = f"open({str(marks)!r}, 'a').write('{number}\\n')"
        return worker_pb2.TaskSpec(
            task_id="t-retried", command=[sys.executable, "-c", script], attempt=number
        )

    async def to_end(spec: worker_pb2.TaskSpec) -> bool:
        already = await tasks.run(spec)
        async for _ in tasks.output(spec.task_id).chunks(0, follow=True):
            pass
        return already

    assert await to_end(attempt(1)) is False
    assert tasks.status("t-retried").attempt == 1
    assert await to_end(attempt(1)) is True, "a retried RunTask of attempt 1: not run again"
    assert marks.read_text() == "1\n"
    assert await to_end(attempt(2)) is False
    status = tasks.status("t-retried")
    assert (status.attempt, status.state) == (2, worker_pb2.TASK_STATE_SUCCEEDED)
    assert marks.read_text() == "1\n2\n"
    assert await tasks.run(attempt(1)) is True, "an older attempt never replaces a newer"
    assert marks.read_text() == "1\n2\n"
