"""How the task commands reach a task's record: the controlplane's gateway when the command
holds an operator token (`GatewayTasks`: no Temporal SDK loaded), else Temporal
(`TemporalTasks`); `Fallback` turns to Temporal when the gateway cannot be reached and says when
the controlplane is down, so that a command can show the task's last recorded state (`Answer`,
`last_answer`, `print_last`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import typer

from levers9.cli import gateway_api
from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable
from levers9.cli.output import console, errors, fail
from levers9.cli.unreachable import no_temporal_worker, unreachable
from levers9.config import ControlplaneSettings
from levers9.errors import ControlplaneUnreachable
from levers9.models import TERMINAL, TaskInput, TaskRecord

if TYPE_CHECKING:
    from temporalio.client import Client

    from levers9.records.tasks import LastRecorded


T = TypeVar("T")


class Tasks(Protocol):
    """Where the command submits tasks and reads their records."""

    async def submit(self, task: TaskInput) -> None: ...

    async def record(self, task_id: str, wait_s: float = 0.0) -> TaskRecord | None:
        """The record now, or once the task ended (at most `wait_s` from now)."""

    async def cancel(self, task_id: str, reason: str) -> bool:
        """Tells the task to cancel; False when no such task runs."""

    async def listing(self, pool_name: str | None) -> list[TaskRecord]:
        """Every task record (of one pool), in no particular order."""


class GatewayTasks:
    """Through the controlplane's gateway, with the operator token."""

    def __init__(self, settings: ControlplaneSettings) -> None:
        self._settings = settings

    async def submit(self, task: TaskInput) -> None:
        await gateway_api.submit_task(self._settings, task)

    async def record(self, task_id: str, wait_s: float = 0.0) -> TaskRecord | None:
        return await gateway_api.task_record(self._settings, task_id, wait_s)

    async def cancel(self, task_id: str, reason: str) -> bool:
        return await gateway_api.cancel_task(self._settings, task_id, reason)

    async def listing(self, pool_name: str | None) -> list[TaskRecord]:
        return await gateway_api.list_tasks(self._settings, pool_name)


class TemporalTasks:
    """Straight from Temporal, with the controlplane's Temporal settings (one client, one loop:
    the SDK's runtime does not survive clients left on loops `asyncio.run` already closed)."""

    def __init__(self, settings: ControlplaneSettings) -> None:
        self._settings = settings
        self._client: Client | None = None

    async def client(self) -> Client:
        if self._client is None:
            from levers9.temporal import connect

            self._client = await connect(self._settings)
        return self._client

    async def submit(self, task: TaskInput) -> None:
        from levers9.records.tasks import start_task
        from levers9.temporal import pool_runtimes, runtime_not_offered, unknown_pool

        client = await self.client()
        queue = self._settings.task_queue
        offered = await pool_runtimes(client, queue, task.pool_name)
        if offered is None:  # as the gateway refuses it: it would wait forever
            problem = await unknown_pool(client, queue, task.pool_name)
            raise typer.BadParameter(problem or "no such pool", param_hint="--pool")
        problem = runtime_not_offered(task.pool_name, task.runtime, offered)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint="--runtime")
        await start_task(client, queue, task)

    async def record(self, task_id: str, wait_s: float = 0.0) -> TaskRecord | None:
        """Asks the record first (within QUERY_WITHIN_S: a controlplane that is down is said
        then, not after the wait), then waits for the end."""
        from levers9.records.found import QUERY_WITHIN_S
        from levers9.records.tasks import task_ended, task_record

        client = await self.client()
        record = await task_record(client, task_id, where_queued=wait_s <= 0, within=QUERY_WITHIN_S)
        if wait_s <= 0 or record is None or record.state in TERMINAL:
            return record
        return await task_ended(client, task_id, wait_s, within=QUERY_WITHIN_S)

    async def last_recorded(self, task_id: str) -> LastRecorded | None:
        from levers9.records.tasks import last_recorded

        return await last_recorded(await self.client(), task_id)

    async def cancel(self, task_id: str, reason: str) -> bool:
        from levers9.records.tasks import cancel_task

        return await cancel_task(await self.client(), task_id, reason)

    async def listing(self, pool_name: str | None) -> list[TaskRecord]:
        """The workflows' memos: what was recorded, whether or not a Temporal worker runs."""
        from levers9.records.tasks import list_tasks

        return await list_tasks(await self.client(), self._settings.task_queue, pool_name)


class Fallback:
    """The gateway (`gateway`: the command holds an operator token), and Temporal once the
    gateway cannot be reached (said once, on stderr). A query there that no Temporal worker
    answers is ControlplaneUnreachable; `last_recorded` reads what Temporal holds then."""

    def __init__(
        self, settings: ControlplaneSettings, gateway: bool = True, *, temporal: bool = True
    ) -> None:
        """`temporal` False: the gateway alone (a workspace token: a workspace sees its tasks
        only as the gateway shows them, never Temporal's whole namespace)."""
        self._settings = settings
        self._gateway: Tasks | None = GatewayTasks(settings) if gateway else None
        self._temporal = TemporalTasks(settings)
        self._temporal_allowed = temporal
        self._gateway_failed = False

    async def _ask(self, call: Callable[[Tasks], Awaitable[T]]) -> T:
        if self._gateway is not None:
            try:
                return await call(self._gateway)
            except GatewayUnavailable as exc:
                if not self._temporal_allowed:
                    raise GatewayOnly(str(exc)) from None
                errors.print(f"asking Temporal directly: {exc}", highlight=False)
                self._gateway = None
                self._gateway_failed = True
        from levers9.records.found import NoQueryAnswer

        try:
            return await call(self._temporal)
        except NoQueryAnswer as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: Exception) -> ControlplaneUnreachable:
        problems = ["its gateway did not answer"] if self._gateway_failed else []
        problems.append(no_temporal_worker(self._settings, str(exc)))
        return unreachable(self._settings, *problems)

    async def last_recorded(self, task_id: str) -> LastRecorded | None:
        return await self._temporal.last_recorded(task_id)

    async def submit(self, task: TaskInput) -> None:
        await self._ask(lambda tasks: tasks.submit(task))

    async def record(self, task_id: str, wait_s: float = 0.0) -> TaskRecord | None:
        return await self._ask(lambda tasks: tasks.record(task_id, wait_s))

    async def cancel(self, task_id: str, reason: str) -> bool:
        return await self._ask(lambda tasks: tasks.cancel(task_id, reason))

    async def listing(self, pool_name: str | None) -> Listed:
        """Newest first. From Temporal (no gateway to ask, or it did not answer): the records
        as their workflows last recorded them (Temporal lists memos without a worker), and, when
        no Temporal worker answers a query of the newest (as `task get` would ask it), why the
        controlplane is unreachable."""
        records = await self._ask(lambda tasks: tasks.listing(pool_name))
        newest_first = sorted(records, key=lambda r: r.created_at, reverse=True)
        if self._gateway is not None or not newest_first:
            return Listed(newest_first)
        from levers9.records.found import NoQueryAnswer

        try:
            await self._temporal.record(newest_first[0].task_id)
        except NoQueryAnswer as exc:
            return Listed(newest_first, self._unreachable(exc))
        return Listed(newest_first)


def answered(call: Coroutine[Any, Any, T]) -> T:
    """Runs the command's calls; the gateway's refusal (an invalid field, say) is one line and
    exit status 1, not a traceback."""
    try:
        return asyncio.run(call)
    except (GatewayRefused, GatewayOnly) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


class GatewayOnly(Exception):
    """The gateway did not answer a workspace token, which has nowhere else to ask."""


def tasks_for(settings: ControlplaneSettings) -> Fallback:
    """The gateway when the command holds a token, else Temporal; with a workspace's token,
    the gateway alone."""
    from levers9.core.workspaces import parse_token

    token = settings.operator_token()
    workspace = token is not None and parse_token(token.get_secret_value()) is not None
    return Fallback(settings, gateway=token is not None, temporal=not workspace)


@dataclass(frozen=True)
class Listed:
    """The task records, newest first; `down`: the controlplane did not answer, and these are
    as Temporal last recorded them."""

    records: list[TaskRecord]
    down: ControlplaneUnreachable | None = None


@dataclass(frozen=True)
class Answer:
    """A task's record, as the controlplane answered; or, when it did not (`down`), as
    Temporal last recorded it (`last`: None when Temporal knows no such task either)."""

    record: TaskRecord | None
    down: ControlplaneUnreachable | None = None
    last: LastRecorded | None = None


async def last_answer(tasks: Fallback, task_id: str, problem: ControlplaneUnreachable) -> Answer:
    last = await tasks.last_recorded(task_id)
    return Answer(last.record if last is not None else None, problem, last)


def print_last(answer: Answer) -> None:
    """The caveat before a last recorded state: which workflow said it, how it stands."""
    last = answer.last
    if last is None:
        return
    attributes = "".join(f", {key}={value}" for key, value in last.search_attributes.items())
    console.print(
        f"last recorded state (the controlplane is down): from the memo of its workflow"
        f" ({last.status}{attributes})",
        highlight=False,
    )
