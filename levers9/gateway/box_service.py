"""`levers9.v1.Boxes`: boxes (BoxWorkflow's records), for `levers9 box ...`.

A box is named within its workspace. A workspace token creates, gets, lists, stops, starts,
uses and deletes its own workspace's boxes only (levers9.gateway.scope: naming another workspace
is PERMISSION_DENIED; another's box by name is NOT_FOUND in the words of a missing one). The
operator sees all, and names the workspace (none: `default`).

A box's task is admitted as a submitted task is (`TasksService.admit`: its volumes and disks
the workspace's, a runtime its pool offers, max-queued) before its record starts. Reads add the
state of the box's task from its record; a box whose task ended though its record still says
running (it continued as new since it started it) is told so (signal `task_ended`). UseBox
(exec, shell, ports, ssh from the CLI) moves the box's idle deadline and names its task.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import grpc

from levers9.box_state import BoxState
from levers9.core.boxes import (
    KEEP_ALIVE,
    RUNNING,
    STOPPED,
    box_name_problem,
    idle_stop_problem,
)
from levers9.gateway.convert import submitted_task
from levers9.gateway.errors import InvalidRequest
from levers9.gateway.roles import Authority, Identity
from levers9.gateway.scope import call_workspace, identify
from levers9.gateway.task_service import TasksService
from levers9.logs import get_logger
from levers9.models import TERMINAL, TaskRecord
from levers9.proto import boxes_pb2, boxes_pb2_grpc
from levers9.records.boxes import BoxExists, TemporalBoxRecords
from levers9.task_wire import submit_request

Context = grpc.aio.ServicerContext[Any, Any]
CONTAINER_START = "container.start"

log = get_logger(__name__)


def _missing(name: str) -> str:
    return f"no box {name}: `levers9 box list` shows them"


def task_state(record: TaskRecord | None) -> str:
    """The box's task's state: `running` once its container runs (the worker reported its
    `container.start`), `starting` before; else its record's."""
    if record is None:
        return ""
    if record.state == "running" and not any(
        p.name == CONTAINER_START and p.at is not None and not p.error for p in record.phases
    ):
        return "starting"
    return record.state


def box_message(box: BoxState, record: TaskRecord | None) -> boxes_pb2.Box:
    message = boxes_pb2.Box(
        name=box.name,
        workspace=box.workspace,
        state=box.state,
        reason=box.reason,
        task_id=box.task_id,
        task_state=task_state(record),
        node_name=(record.node_name or "") if record is not None else "",
        idle_stop_seconds=box.idle_stop_seconds,
        starts=box.starts,
        task=submit_request(box.task),
    )
    message.created_at.FromDatetime(box.created_at)
    if box.last_used_at is not None:
        message.last_used_at.FromDatetime(box.last_used_at)
    for event in box.events:
        shown_event = message.events.add(kind=event.kind, message=event.message)
        shown_event.at.FromDatetime(event.at)
    return message


class BoxesService(boxes_pb2_grpc.BoxesServicer):
    def __init__(
        self, records: TemporalBoxRecords, tasks: TasksService, authority: Authority
    ) -> None:
        self._records = records
        self._tasks = tasks
        self._authority = authority

    @staticmethod
    async def _name(context: Context, name: str) -> None:
        problem = box_name_problem(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name: {problem}")

    async def _workspace(
        self, identity: Identity, asked: str, context: Context, *, creating: bool
    ) -> str:
        return await call_workspace(
            self._authority, identity, asked, context, objects="boxes", creating=creating
        )

    async def _own(self, identity: Identity, request: Any, context: Context) -> BoxState:
        """The box when the caller may see it; NOT_FOUND, in the words of a missing box, when
        there is none or it is another workspace's."""
        await self._name(context, request.name)
        workspace = await self._workspace(identity, request.workspace, context, creating=False)
        box = await self._records.get(workspace, request.name)
        if box is None or not identity.sees(box.workspace):
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(request.name))
        assert box is not None
        return box

    async def _task(self, box: BoxState) -> TaskRecord | None:
        """The record of the box's task; a box that reads running though its task ended is
        told (and read as stopped)."""
        if not box.task_id:
            return None
        record = await self._tasks.record_of(box.task_id)
        if record is not None and box.state == RUNNING and record.state in TERMINAL:
            await self._records.task_ended(box, record.state, record.reason)
            box.state = "stopped"
            box.reason = f"its task {box.task_id} ended {record.state}: {record.reason}"
        return record

    async def _answer(self, box: BoxState) -> boxes_pb2.Box:
        return box_message(box, await self._task(box))

    async def CreateBox(
        self, request: boxes_pb2.CreateBoxRequest, context: Context
    ) -> boxes_pb2.CreateBoxResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        problem = idle_stop_problem(request.idle_stop_seconds)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"idle_stop_seconds: {problem}")
        workspace = await self._workspace(identity, request.workspace, context, creating=True)
        submitted = boxes_pb2.CreateBoxRequest()
        submitted.CopyFrom(request)
        spec = submitted.task.task
        if not spec.task_id:
            spec.task_id = f"{request.name}-0"
        if not spec.command:
            spec.command.extend(KEEP_ALIVE)
        try:
            task = submitted_task(submitted.task)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        task = await self._tasks.admit(
            task.model_copy(update={"workspace": workspace}), identity, context
        )
        state = BoxState(
            name=request.name,
            workspace=task.workspace,
            task=task,
            idle_stop_seconds=request.idle_stop_seconds,
            created_at=datetime.now(UTC),
        )
        try:
            await self._records.create(state)
        except BoxExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        log.info(
            "box created",
            box=state.name,
            workspace=state.workspace,
            pool_name=task.pool_name,
            gpus=task.gpus,
            idle_stop_seconds=state.idle_stop_seconds,
        )
        return boxes_pb2.CreateBoxResponse(box=box_message(state, None))

    async def GetBox(
        self, request: boxes_pb2.GetBoxRequest, context: Context
    ) -> boxes_pb2.GetBoxResponse:
        identity = await identify(self._authority, context)
        box = await self._own(identity, request, context)
        return boxes_pb2.GetBoxResponse(box=await self._answer(box))

    async def ListBoxes(
        self, request: boxes_pb2.ListBoxesRequest, context: Context
    ) -> boxes_pb2.ListBoxesResponse:
        identity = await identify(self._authority, context)
        workspace: str | None = identity.workspace
        if identity.operator and request.workspace:
            workspace = request.workspace
        elif request.workspace:
            workspace = await self._workspace(identity, request.workspace, context, creating=False)
        try:
            boxes = await self._records.list(workspace)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        seen = [b for b in boxes if identity.sees(b.workspace)]
        return boxes_pb2.ListBoxesResponse(boxes=[await self._answer(b) for b in seen])

    async def _changed(self, box: BoxState | None, name: str, context: Context) -> BoxState:
        if box is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(name))
        assert box is not None
        return box

    async def StopBox(
        self, request: boxes_pb2.StopBoxRequest, context: Context
    ) -> boxes_pb2.StopBoxResponse:
        identity = await identify(self._authority, context)
        box = await self._own(identity, request, context)
        stopped = await self._changed(
            await self._records.stop(box, "box stop"), request.name, context
        )
        refused = stopped.events[-1] if stopped.events else None
        if stopped.state == "running" and refused is not None and refused.kind == "stop-refused":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused.message)
        log.info("box stopped", box=box.name, workspace=box.workspace, task_id=box.task_id)
        return boxes_pb2.StopBoxResponse(box=await self._answer(stopped))

    async def StartBox(
        self, request: boxes_pb2.StartBoxRequest, context: Context
    ) -> boxes_pb2.StartBoxResponse:
        identity = await identify(self._authority, context)
        box = await self._own(identity, request, context)
        await self._task(box)  # a task that ended unseen: its record is told first
        if request.elsewhere:
            await self._elsewhere(box, context)
        started = await self._changed(
            await self._records.start(box, elsewhere=request.elsewhere), request.name, context
        )
        log.info("box started", box=box.name, workspace=box.workspace, task_id=started.task_id)
        return boxes_pb2.StartBoxResponse(box=await self._answer(started))

    @staticmethod
    async def _elsewhere(box: BoxState, context: Context) -> None:
        """`box start --elsewhere` needs a stopped box whose checkpoint is in its volume (any
        machine fetches it from there); FAILED_PRECONDITION saying why not."""
        why = ""
        if box.state != STOPPED:
            why = f"it is {box.state}, not stopped"
        elif not box.checkpoint:
            why = "it has no checkpoint to restore (its next start is fresh, anywhere)"
        elif not box.checkpoint_stored:
            why = (
                f"its checkpoint {box.checkpoint} is kept on node {box.checkpoint_node} only:"
                " a box created with --checkpoints VOLUME keeps them where any machine can"
                " fetch them"
            )
        if why:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"box {box.name} cannot start elsewhere: {why}",
            )

    async def DeleteBox(
        self, request: boxes_pb2.DeleteBoxRequest, context: Context
    ) -> boxes_pb2.DeleteBoxResponse:
        identity = await identify(self._authority, context)
        box = await self._own(identity, request, context)
        deleted = await self._changed(await self._records.delete(box), request.name, context)
        log.info("box deleted", box=box.name, workspace=box.workspace, task_id=box.task_id)
        return boxes_pb2.DeleteBoxResponse(box=box_message(deleted, None))

    async def UseBox(
        self, request: boxes_pb2.UseBoxRequest, context: Context
    ) -> boxes_pb2.UseBoxResponse:
        identity = await identify(self._authority, context)
        box = await self._own(identity, request, context)
        record = await self._task(box)
        if box.state != RUNNING:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"box {box.name} is {box.state} ({box.reason}): levers9 box start {box.name}",
            )
        if task_state(record) != "running":
            doing = task_state(record) or "not started yet"
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"box {box.name}'s task {box.task_id or '-'} is {doing}, not running yet:"
                f" levers9 box get {box.name} says why; try again once it runs",
            )
        await self._records.used(box)
        log.info("box used", box=box.name, workspace=box.workspace, use=request.use[:32])
        return boxes_pb2.UseBoxResponse(box=box_message(box, record))
