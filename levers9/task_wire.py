"""A task's fields on the wire: the one copy between levers9.models.TaskInput and the proto
TaskSpec (levers9/proto/worker.proto), which `levers9 run` submits (Tasks.SubmitTask) and a
worker runs (WorkerService.RunTask). A task field is added in three places: TaskSpec, TaskInput
and the two functions here (tests/unit/test_task_wire.py fails while one is missing).

Pure: no checks here; the gateway checks what a client sends before it becomes a TaskInput
(levers9.gateway.convert.submitted_task), the agent what reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence

from levers9.models import TaskInput
from levers9.proto import gateway_pb2, worker_pb2


def task_spec(task: TaskInput, gpu_indices: Sequence[int] = ()) -> worker_pb2.TaskSpec:
    """The task as the wire carries it; `gpu_indices`: the cards its placement chose (none
    when it is submitted)."""
    return worker_pb2.TaskSpec(
        task_id=task.task_id,
        image=task.image,
        command=list(task.command),
        env=dict(task.env),
        gpu_indices=list(gpu_indices),
        memory_bytes=task.memory_bytes,
        cpu_millis=task.cpu_millis,
        ports=list(task.ports),
        ready_path=task.ready_path,
        stop_grace_seconds=task.stop_grace_seconds,
    )


def task_input(spec: worker_pb2.TaskSpec, *, pool_name: str, gpus: int) -> TaskInput:
    """The task a TaskSpec describes, to run on `gpus` cards of a worker of `pool_name`."""
    return TaskInput(
        task_id=spec.task_id,
        pool_name=pool_name,
        command=tuple(spec.command),
        gpus=gpus,
        image=spec.image,
        env=dict(spec.env),
        memory_bytes=spec.memory_bytes,
        cpu_millis=spec.cpu_millis,
        ports=tuple(spec.ports),
        ready_path=spec.ready_path,
        stop_grace_seconds=spec.stop_grace_seconds,
    )


def submit_request(task: TaskInput) -> gateway_pb2.SubmitTaskRequest:
    """What a client sends to start `task`'s record through the gateway."""
    return gateway_pb2.SubmitTaskRequest(
        pool_name=task.pool_name, gpus=task.gpus, task=task_spec(task)
    )
