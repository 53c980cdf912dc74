"""`levers9 pool check --all`: the checks the product page asks for before relying on a pool,
one after the other, each timed: the GPU check, a GPU endpoint (created at zero replicas: a
cold start and one request through its URL), a box port (a box with a web server, reached
through its `box ports` URL), a checkpoint restore (a counting `--runtime runsc` box with a web
server stopped right after its URL answered, started, and read with exec: its count goes on from
where it was, and its URL answers again), and a multi-card job (one
task taking all the cards a machine of the pool offers).

Everything the checks make is named `check-<6 hex>...` and deleted after its check, and once
more at the end whatever happened (a failure, Ctrl-C). Each check goes through the gateway
with the CLI's token, as the matching `levers9` command does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from temporalio.service import RPCError

from levers9.cli.endpoint_access import EndpointAccess, Refused
from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
    GatewayRefused,
    GatewayUnavailable,
    cancel_task,
    exec_in_task,
    gateway_stub,
)
from levers9.cli.pool_reads import list_machines
from levers9.cli.task_access import tasks_for
from levers9.config import ControlplaneSettings
from levers9.core.endpoints import EndpointSpec
from levers9.errors import Unreachable
from levers9.gateway.box_front import box_url
from levers9.gateway.endpoint_messages import REPLICA_HEADER
from levers9.models import TaskInput, TaskRecord
from levers9.proto import boxes_pb2, boxes_pb2_grpc
from levers9.records.listing import list_worker_records
from levers9.records.tasks import PROBE_COMMAND, check_mismatch, check_report, saw_no_card
from levers9.task_wire import submit_request

if TYPE_CHECKING:
    from levers9.proto.boxes_pb2_grpc import BoxesAsyncStub as BoxesStub

T = TypeVar("T")
Metadata = tuple[tuple[str, str]]

NAMES = ("gpu check", "gpu endpoint", "box port", "checkpoint restore", "multi-card job")
MARKER = "levers9-pool-check"
ENDPOINT_PORT = 8000
BOX_PORT = 8080
SERVE = (
    f"mkdir -p /tmp/www && echo {MARKER} > /tmp/www/index.html && cd /tmp/www"
    ' && exec python -m http.server "$PORT" --bind "$LEVERS9_HOST"'
)
"""A web server on the task's published port (the agent says where: `$LEVERS9_HOST:$PORT`)."""
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"
SERVE_AND_COUNT = (
    f"mkdir -p /tmp/www && echo {MARKER} > /tmp/www/index.html && cd /tmp/www"
    ' && (python -m http.server "$PORT" --bind "$LEVERS9_HOST" >/dev/null 2>&1 &) && ' + COUNTER
)
"""The checkpoint's box: a counter and a web server, both of which a restore must carry."""
CARDS = "ls /dev | grep -c '^nvidia[0-9]' || true; nvidia-smi -L 2>/dev/null || true"
POLL_S = 0.5
STOP_TIMEOUT_S = 400.0
"""Past the box workflow's checkpoint (its activity has 6 minutes); a shorter call gives up on
an answer that still comes."""
DELETE_WAIT_S = 150.0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CheckResult:
    """One check's line: its name, whether it passed, how long it took and what it saw."""

    name: str
    ok: bool
    seconds: float
    detail: str

    def as_json(self) -> dict[str, object]:
        return {
            "check": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 1),
            "detail": self.detail,
        }


def check_line(result: CheckResult) -> str:
    """`ok      gpu check            12.3s  NVIDIA H200 on node-a`: aligned, one per check."""
    width = max(len(name) for name in NAMES)
    status = "ok" if result.ok else "FAILED"
    return f"{status:<6}  {result.name:<{width}}  {result.seconds:6.1f}s  {result.detail}"


def summary_line(results: list[CheckResult], pool: str) -> str:
    failed = [r.name for r in results if not r.ok]
    if not failed:
        return f"pool {pool}: all {len(results)} checks passed"
    return f"pool {pool}: {len(failed)} of {len(results)} checks failed ({', '.join(failed)})"


class CheckFailed(Exception):
    """A check saw something wrong; the message is its line's detail."""


@dataclass
class Made:
    """What the checks created, to delete whatever happens."""

    endpoints: list[str] = field(default_factory=list)
    boxes: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)


class PoolChecks:
    """The five checks on one pool, one after the other, each within `wait_s`."""

    def __init__(
        self,
        settings: ControlplaneSettings,
        pool: str,
        *,
        gpu: str,
        simulated: bool,
        wait_s: float,
        progress: Progress,
        done: Callable[[CheckResult], None] = lambda _: None,
        checkpoints: str = "",
    ) -> None:
        self.checkpoints = checkpoints
        """A volume for the checkpoint restore's image ("": its node keeps it)."""
        self.settings = settings
        self.pool = pool
        self.gpu = gpu
        self.simulated = simulated
        self.wait_s = wait_s
        self.progress = progress
        self.done = done
        self.prefix = f"check-{uuid.uuid4().hex[:6]}"
        self.made = Made()
        self.tasks = tasks_for(settings)

    async def run(self) -> list[CheckResult]:
        steps: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("gpu check", self.gpu_check),
            ("gpu endpoint", self.endpoint),
            ("box port", self.box_port),
            ("checkpoint restore", self.checkpoint_restore),
            ("multi-card job", self.multi_card),
        ]
        results = []
        try:
            for name, step in steps:
                result = await self._timed(name, step)
                results.append(result)
                self.done(result)
                await self.clean_up()
        finally:
            if self.made.endpoints or self.made.boxes or self.made.tasks:
                self.progress(f"deleting what the checks made ({self.prefix}-...)")
                await self.clean_up()
        return results

    async def _timed(self, name: str, step: Callable[[], Awaitable[str]]) -> CheckResult:
        self.progress(f"{name}: starting")
        started = time.monotonic()
        ok = False
        try:
            detail = await asyncio.wait_for(step(), self.wait_s)
            ok = True
        except CheckFailed as exc:
            detail = str(exc)
        except TimeoutError:
            detail = f"no result within {self.wait_s:g} s"
        except (GatewayRefused, GatewayUnavailable, Refused) as exc:
            detail = str(exc)
        return CheckResult(name, ok, time.monotonic() - started, " ".join(detail.split()))

    # The checks.

    async def _run_task(self, task: TaskInput) -> TaskRecord:
        await self.tasks.submit(task)
        self.made.tasks.append(task.task_id)
        self.progress(f"  task {task.task_id} submitted ({task.gpus} card(s)), waiting for its end")
        deadline = time.monotonic() + self.wait_s
        while True:
            record = await self.tasks.record(task.task_id, min(30.0, self.wait_s))
            if record is not None and record.state in ("succeeded", "failed", "cancelled"):
                self.made.tasks.remove(task.task_id)
                return record
            if record is not None and record.state == "queued":
                waited = self.wait_s - (deadline - time.monotonic())
                self.progress(
                    f"  task {task.task_id} queued for {waited:.0f} s: no worker of pool"
                    f" {self.pool} has {task.gpus} card(s) free for it yet (levers9 task get"
                    f" {task.task_id} says why)"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError
            await asyncio.sleep(POLL_S)

    async def gpu_check(self) -> str:
        task = TaskInput(
            task_id=f"{self.prefix}-gpu", pool_name=self.pool, command=PROBE_COMMAND, gpus=1
        )
        record = await self._run_task(task)
        report = check_report(record)
        if record.state != "succeeded":
            raise CheckFailed(f"task {task.task_id} {record.state}: {report.get('reason', '')}")
        seen = next((str(report[k]) for k in ("device", "nvidia_smi") if report.get(k)), "")
        mismatch = check_mismatch(report, self.gpu or seen, simulated=self.simulated)
        if mismatch:
            raise CheckFailed(mismatch)
        if saw_no_card(report):
            return (
                f"1 card on {record.node_name}: simulated (simulatedGpus), the container saw none"
            )
        return f"1 x {seen} on {record.node_name}, matmul ok"

    async def endpoint(self) -> str:
        name = self.prefix
        spec = EndpointSpec(
            name=name,
            pool_name=self.pool,
            command=("sh", "-c", SERVE),
            port=ENDPOINT_PORT,
            gpus=1,
            idle_seconds=60.0,
            cold_start_timeout_seconds=self.wait_s,
            request_timeout_seconds=self.wait_s,
            workspace="",
        )
        await EndpointAccess(self.settings).create(spec)
        self.made.endpoints.append(name)
        url = f"{self.settings.endpoints_base_url()}/{name}/"
        self.progress(f"  endpoint {name} created at 0 replicas; GET {url} (a cold start)")
        started = time.monotonic()
        status, body, replica = await self._get(url)
        took = time.monotonic() - started
        if status != 200 or MARKER not in body:
            raise CheckFailed(f"GET {url} answered {status}: {body[:200]}")
        return f"cold start and first answer in {took:.1f}s (200 from replica {replica})"

    async def box_port(self) -> str:
        name = f"{self.prefix}-web"
        box = await self._create_box(name, SERVE, ports=(BOX_PORT,))
        url = box_url(self.settings.endpoints_base_url(), box.workspace, name, BOX_PORT)
        self.progress(f"  box {name} runs on {box.node_name}; GET {url}")
        while True:
            status, body, _ = await self._get(url)
            if status == 200 and MARKER in body:
                return f"box {name} on {box.node_name}: {url} answered 200"
            self.progress(f"  {url} answered {status}, again")
            await asyncio.sleep(1.0)

    async def checkpoint_restore(self) -> str:
        name = f"{self.prefix}-count"
        try:
            box = await self._create_box(
                name, SERVE_AND_COUNT, ports=(BOX_PORT,), runtime="runsc", volume=self.checkpoints
            )
            not_offered = ""
        except GatewayRefused as exc:
            if "task.runtime" not in str(exc):
                raise
            # No runsc here: a box of the pool's default runtime, whose worker says why it
            # cannot checkpoint it (runc: CRIU's check).
            not_offered = f"pool {self.pool} offers no runsc (gVisor); "
            self.progress(f"  {exc}: a box of the pool's default runtime instead")
            box = await self._create_box(name, COUNTER)
        before_node = box.node_name
        url = box_url(self.settings.endpoints_base_url(), box.workspace, name, BOX_PORT)
        serves = not_offered == ""
        if serves:
            await self._served(url)  # a request just before the stop: a restore carries it
        count = await self._count(box.task_id, at_least=3)
        self.progress(f"  box {name} counts ({count}) on {before_node}; box stop (a checkpoint)")
        stopped = await self._boxes(
            lambda stub, md: stub.StopBox(
                boxes_pb2.StopBoxRequest(name=name), metadata=md, timeout=STOP_TIMEOUT_S
            )
        )
        if stopped.box.state != "stopped" or "checkpointed to" not in stopped.box.reason:
            raise CheckFailed(f"{not_offered}box stop took no checkpoint: {_why_none(stopped.box)}")
        # Elsewhere when its image is in a volume and the pool has another machine.
        elsewhere = bool(self.checkpoints) and len(await self._cards_by_node()) > 1
        where = "on another machine" if elsewhere else "on the machine that took it"
        self.progress(f"  {stopped.box.reason}; box start (a restore, {where})")
        start = boxes_pb2.StartBoxRequest(name=name, elsewhere=elsewhere)
        await self._boxes(
            lambda stub, md: stub.StartBox(start, metadata=md, timeout=CALL_TIMEOUT_S * 2)
        )
        box = await self._running(name)
        after = await self._count(box.task_id, at_least=1)
        if after < count:
            raise CheckFailed(
                f"the count was {count} at stop and {after} after start: not restored"
            )
        later = await self._count(box.task_id, at_least=after + 1)
        if serves:
            await self._served(url)
        moved = "another machine" if box.node_name != before_node else "the same machine"
        answered = "; its URL answered before the stop and after the start" if serves else ""
        return (
            f"count {count} at stop, {after} after start, then {later}{answered}; restored on"
            f" {moved} ({before_node} -> {box.node_name})"
        )

    async def _served(self, url: str) -> None:
        """Until `url` answers 200 with the check's marker."""
        while True:
            status, body, _ = await self._get(url)
            if status == 200 and MARKER in body:
                return
            self.progress(f"  {url} answered {status}, again")
            await asyncio.sleep(1.0)

    async def multi_card(self) -> str:
        cards_by_node = await self._cards_by_node()
        if not cards_by_node:
            raise CheckFailed(f"pool {self.pool} has no machine now (levers9 machine list)")
        node, cards = max(cards_by_node.items(), key=lambda item: (item[1], item[0]))
        if cards < 2:
            raise CheckFailed(
                f"no machine of pool {self.pool} offers 2 cards or more (the most: {cards},"
                f" on {node})"
            )
        task = TaskInput(
            task_id=f"{self.prefix}-cards",
            pool_name=self.pool,
            command=("sh", "-c", CARDS),
            gpus=cards,
        )
        record = await self._run_task(task)
        if record.state != "succeeded":
            raise CheckFailed(f"task {task.task_id} {record.state}: {record.reason}")
        indices = ",".join(map(str, record.gpu_indices))
        return f"{cards} cards on {record.node_name} (cards {indices}): all the machine offers"

    async def _cards_by_node(self) -> dict[str, int]:
        """The cards each machine of the pool offers: those no neighbour holds (its record's
        free ones, plus its live worker's, which took them)."""
        machines = [m for m in await list_machines(self.settings, self.pool) if m.machine]
        cards = {m.node_name: m.free_gpus for m in machines}
        try:
            workers = await list_worker_records(self.settings, self.pool, include_ended=False)
        except Unreachable:  # a workspace's CLI may not reach Temporal: the free cards, then
            workers = []
        for worker in workers:
            if worker.state in ("pending", "available") and worker.node_name in cards:
                cards[worker.node_name] += worker.gpus
        return cards

    # Boxes and HTTP.

    async def _boxes(self, call: Callable[[BoxesStub, Metadata], Awaitable[T]]) -> T:
        async with gateway_stub(self.settings, boxes_pb2_grpc.BoxesStub) as (stub, metadata):
            return await call(stub, metadata)

    async def _create_box(
        self,
        name: str,
        script: str,
        *,
        ports: tuple[int, ...] = (),
        runtime: str = "",
        volume: str = "",
    ) -> boxes_pb2.Box:
        task = TaskInput(
            task_id=f"{name}-0",
            pool_name=self.pool,
            command=("sh", "-c", script),
            gpus=0,
            ports=ports,
            runtime=runtime,
            checkpoint_volume=volume,
        )
        request = boxes_pb2.CreateBoxRequest(name=name, task=submit_request(task))
        await self._boxes(
            lambda stub, md: stub.CreateBox(request, metadata=md, timeout=CALL_TIMEOUT_S)
        )
        self.made.boxes.append(name)
        self.progress(f"  box {name} created{f' (runtime {runtime})' if runtime else ''}")
        return await self._running(name)

    async def _running(self, name: str) -> boxes_pb2.Box:
        while True:
            reply = await self._boxes(
                lambda stub, md: stub.GetBox(
                    boxes_pb2.GetBoxRequest(name=name), metadata=md, timeout=CALL_TIMEOUT_S
                )
            )
            box = reply.box
            if box.state == "running" and box.task_state == "running":
                return box
            if box.state == "stopped":
                raise CheckFailed(f"box {name} stopped: {box.reason}")
            await asyncio.sleep(POLL_S)

    async def _count(self, task_id: str, *, at_least: int) -> int:
        """The box's count (its /tmp/count, read with exec), once it is `at_least`."""
        while True:
            out: list[bytes] = []
            code = await exec_in_task(
                self.settings, task_id, ["cat", "/tmp/count"], None, out.append, lambda _: None
            )
            text = b"".join(out).decode(errors="replace").strip()
            if code == 0 and text.isdigit() and int(text) >= at_least:
                return int(text)
            await asyncio.sleep(POLL_S)

    async def _get(self, url: str) -> tuple[int, str, str]:
        """GET with the CLI's token: the status, the body and the replica that answered."""
        import aiohttp  # only here: the CLI's other commands start without it

        token = self.settings.operator_token()
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        context: ssl.SSLContext | bool = True
        if url.startswith("https:") and self.settings.gateway_tls_ca_file:
            context = ssl.create_default_context(cafile=str(self.settings.gateway_tls_ca_file))
        timeout = aiohttp.ClientTimeout(total=self.wait_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers, ssl=context) as response,
        ):
            return response.status, await response.text(), response.headers.get(REPLICA_HEADER, "-")

    # Cleaning up.

    async def clean_up(self) -> None:
        """Deletes what the checks made; each deletion best effort (a failure says so)."""
        endpoints = EndpointAccess(self.settings)
        for name in list(self.made.endpoints):
            with self._quietly(f"endpoint {name}"):
                if await endpoints.delete(name):
                    await endpoints.deleted(name, DELETE_WAIT_S)
            self.made.endpoints.remove(name)
        for name in list(self.made.boxes):
            with self._quietly(f"box {name}"):
                await self._delete_box(name)
            self.made.boxes.remove(name)
        for task_id in list(self.made.tasks):
            with self._quietly(f"task {task_id}"):
                await cancel_task(self.settings, task_id, "pool check ended")
            self.made.tasks.remove(task_id)

    async def _delete_box(self, name: str) -> None:
        request = boxes_pb2.DeleteBoxRequest(name=name)
        await self._boxes(
            lambda stub, md: stub.DeleteBox(request, metadata=md, timeout=CALL_TIMEOUT_S)
        )

    @contextlib.contextmanager
    def _quietly(self, what: str) -> Iterator[None]:
        try:
            yield
        except (GatewayRefused, GatewayUnavailable, Refused, OSError) as exc:
            self.progress(f"  could not delete {what}: {exc}")


def _why_none(box: boxes_pb2.Box) -> str:
    """Why a box stop took no checkpoint: the worker's words (runc: CRIU's check), else the
    box's reason."""
    refused = [e.message for e in box.events if e.kind == "stop-refused"]
    if refused:
        return refused[-1]
    _, took_none, why = box.reason.partition("(the worker took none: ")
    return why.removesuffix(")") if took_none else box.reason


async def checkpoint_capability(settings: ControlplaneSettings, pool: str) -> str | None:
    """What the pool's live workers say they can checkpoint with, e.g. `runsc (3 workers)` or
    `none (runsc: ...; criu check: ...) on node-a`; None when the records cannot be read (a
    workspace's CLI may not reach Temporal) or no worker is live."""
    try:
        workers = await list_worker_records(settings, pool, include_ended=False)
    except (Unreachable, RPCError):
        return None
    nodes: dict[str, list[str]] = {}
    for worker in workers:
        if worker.state == "available":
            said = worker.checkpoint or "not reported (an older agent)"
            nodes.setdefault(said, []).append(worker.node_name)
    if not nodes:
        return None
    if len(nodes) == 1:
        [(said, on)] = nodes.items()
        return f"{said} ({len(on)} worker{'s' if len(on) > 1 else ''})"
    return "; ".join(f"{said} on {', '.join(on)}" for said, on in sorted(nodes.items()))


def results_json(
    pool: str, results: list[CheckResult], checkpoint_capability: str | None = None
) -> str:
    return json.dumps(
        {
            "pool": pool,
            "ok": all(r.ok for r in results),
            "checks": [r.as_json() for r in results],
            "checkpoint_capability": checkpoint_capability,
        },
        indent=2,
    )
