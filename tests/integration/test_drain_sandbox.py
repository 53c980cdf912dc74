"""`kubectl drain` of a sandbox node running a `--retries 1` task, end to end on the sandbox's
real agents and the real kubectl: the pool's PodDisruptionBudget (`workers-<pool>`) refuses the
eviction of the worker's pod while its task runs (the drain says it would violate the budget and
retries); the reconcile sees the node cordoned, the controlplane takes the task off the worker
(its attempt ends `preempted` with the drain's reason, not `lost` under a killed agent), labels
the pod `levers9.dev/drained=true` and ends the worker `stopped`; the drain then completes and
the task's second attempt succeeds on another node. A `--runtime runsc` box on a drained node is
stopped as `box stop` stops it, its task checkpointed, before the drain may go on; once the node
is uncordoned, `box start` restores it there and its counter goes on.

The tests of this module share one sandbox and one controlplane and run in order (each drains
one of its three nodes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.core.manifests import disruption_budget_name
from levers9.models import TERMINAL, TaskRecord
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from levers9.temporal import connect
from sandbox.disruption import VIOLATION
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
DRAIN_TIMEOUT_S = 240
"""kubectl drain's own bound: the drain waits for a reconcile pass, the task's stop and a
heartbeat of the worker before the budget lets its pod go."""
UNTIL_DONE = "while [ ! -e /tmp/done ]; do sleep 1; done"
"""Each attempt runs until the test touches /tmp/done in its container (a fresh one per
attempt): the first outlives any wait of the drain, the second ends when told."""


COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Controlplane, Client]]:
    runtimes = {"runtimes": ["runc", "runsc"]}  # runc the default; runsc boxes checkpoint
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("drain"), pool_settings=runtimes, containers=True
    ) as cp:
        await eventually(lambda: workers_available(cp), within=WITHIN)
        yield cp, await connect(cp.settings)


async def _record(client: Client, task_id: str) -> TaskRecord:
    record = await task_record(client, task_id)
    assert record is not None, task_id
    return record


class _Drain:
    """`kubectl drain NODE` running in the background, its output collected as it comes."""

    def __init__(self, cp: Controlplane, node: str) -> None:
        self._cp, self._node = cp, node
        self.output: list[str] = []
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Drain:
        kubeconfig = str(self._cp.sandbox.state.dir / "kubeconfig")
        self._process = await asyncio.create_subprocess_exec(
            *("kubectl", "--kubeconfig", kubeconfig, "drain", self._node),
            *("--ignore-daemonsets", "--delete-emptydir-data", "--force"),
            f"--timeout={DRAIN_TIMEOUT_S}s",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for line in self._process.stdout:
            self.output.append(line.decode(errors="replace"))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.output)

    async def finished(self) -> int:
        assert self._process is not None
        assert self._reader is not None
        await self._reader
        return await self._process.wait()

    async def __aexit__(self, *exc: object) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


async def test_a_drain_waits_for_the_agent_then_the_task_succeeds_on_another_node(
    plane: tuple[Controlplane, Client],
) -> None:
    cp, client = plane
    [budget] = json.loads(await cp.kubectl("get", "pdb", "-A", "-o", "json"))["items"]
    assert budget["metadata"]["name"] == disruption_budget_name(POOL)
    assert budget["spec"]["maxUnavailable"] == 0

    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "1", "--detach", "--retries", "1", "--",
        "sh", "-c", UNTIL_DONE,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = done.stdout.strip()

    seen: list[TaskRecord] = []

    async def running() -> bool:
        seen.append(await _record(client, task_id))
        return seen[-1].state == "running"

    await eventually(running, within=WITHIN)
    node = seen[-1].node_name
    assert node

    async def started() -> bool:  # its container runs (not still unpacking its image)
        return (await cp.cli("exec", task_id, "--", "true")).returncode == 0

    await eventually(started, within=WITHIN)
    async with _Drain(cp, node) as drain:

        async def refused() -> bool:  # the eviction of the worker's pod, while the task runs
            return drain.said(VIOLATION)

        await eventually(refused, within=WITHIN)

        async def again_elsewhere() -> bool:
            seen.append(await _record(client, task_id))
            return seen[-1].state == "running" and seen[-1].node_name not in (None, node)

        await eventually(again_elsewhere, within=WITHIN)
        await eventually(started, within=WITHIN)
        touched = await cp.cli("exec", task_id, "--", "touch", "/tmp/done")
        assert touched.returncode == 0, touched.stdout + touched.stderr
        assert await asyncio.wait_for(drain.finished(), DRAIN_TIMEOUT_S + 30) == 0, drain.output
        assert drain.said(f"node/{node} drained"), drain.output

    async def ended() -> bool:
        seen.append(await _record(client, task_id))
        return seen[-1].state in TERMINAL

    await eventually(ended, within=WITHIN)
    record = seen[-1]
    assert record.state == "succeeded", (record.state, record.reason, record.attempts)
    [first] = record.attempts
    assert (first.state, first.node_name) == ("preempted", node), first
    assert first.reason == f"preempted: its node {node} is cordoned (drain)", first
    assert record.node_name != node
    workers = await list_worker_records(cp.settings, POOL, include_ended=True)
    [drained] = [w for w in workers if w.worker_id == first.worker_id]
    assert (drained.state, drained.reason) == (
        "stopped",
        f"drained: its node {node} is cordoned (drain)",
    ), drained


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_a_drain_checkpoints_a_runsc_box_and_box_start_restores_it(
    plane: tuple[Controlplane, Client],
) -> None:
    cp, client = plane
    _ok(await cp.cli("workspace", "create", "drained"))
    token = _ok(await cp.cli("workspace", "token", "create", "drained", "--name", "ci")).strip()

    async def box(*args: str) -> subprocess.CompletedProcess[str]:
        return await cp.cli("box", *args, token=token)

    async def shown() -> dict[str, Any]:
        got: dict[str, Any] = json.loads(_ok(await box("get", "counter", "-o", "json")))
        return got

    create = ("create", "counter", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await box(*create, "--", "sh", "-c", COUNTER))

    async def running() -> bool:
        return bool((await shown())["task_state"] == "running")

    async def read() -> int:
        done = await box("exec", "counter", "--", "cat", "/tmp/count")
        return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0

    async def counted() -> bool:
        return await read() >= 10

    await eventually(running, within=WITHIN)
    before = await shown()
    node = str(before["node"])
    await eventually(counted, within=WITHIN)
    first = await read()
    async with _Drain(cp, node) as drain:
        assert await asyncio.wait_for(drain.finished(), DRAIN_TIMEOUT_S + 30) == 0, drain.output
    stopped = await shown()
    assert stopped["state"] == "stopped", stopped
    assert "checkpointed to counter-1-" in str(stopped["reason"]), stopped
    assert f"its node {node} is cordoned" in str(stopped["reason"]), stopped  # the drain's words
    record = await task_record(client, str(before["task"]))
    assert record is not None
    assert (record.state, record.node_name) == ("cancelled", node), record
    assert "checkpointed to counter-1-" in record.reason, record

    await cp.kubectl("uncordon", node)  # the image is on that node: the restore is pinned there
    started = _ok(await box("start", "counter"))
    assert "its processes restored from checkpoint counter-1-" in started, started
    await eventually(running, within=WITHIN)
    after = await shown()
    assert (after["node"], after["task"] != before["task"]) == (node, True), (before, after)

    async def went_on() -> bool:  # restored, not restarted: a fresh counter reads 1, 2, ...
        return await read() > first

    await eventually(went_on, within=WITHIN)
    _ok(await box("delete", "counter"))
