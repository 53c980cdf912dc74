"""A cluster joined (`levers9 cluster join`) while two controlplane replicas (worker_main `a` and
`b`) run behind the balancer that plays the gateway's Service: its agent holds one session, with
whichever replica its connection reached, and the other reaches the cluster's API through it.

- The session's route is recorded (`cluster-session:<name>`) and names the holder. The other
  replica loads the pool when a call names it, and its Kubernetes calls are relayed to the
  holder: a reconcile pass of the pool completes on its Temporal worker, its log says it relays
  to the holder's gateway, and the holder's log says it served connections relayed by it. The
  pool's three workers come up and a task on it succeeds through either replica's gateway.
- kill -9 of the holder: the agent redials through the balancer to the other replica, whose
  route is then the latest; reconcile passes go on, the workers come back, a task succeeds; the
  killed replica started again reaches the cluster through the new holder.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is two replicas holding a joined cluster's route, a task run to prove
the route, not the container a task runs in (tests/integration/test_tasks_sandbox.py runs tasks as
a user does, in containers).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from levers9.gateway.cluster_relay import TemporalClusterRoutes
from levers9.models import WorkerRecord
from levers9.providers.joined import ClusterRoute
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from tests.reliability.world import SETTLE_S, World, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
NAME = "joined"
SELECTOR = "cloud.google.com/gke-accelerator=nvidia-rtx-pro-6000"
IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"
RELAYING = "relaying to the replica holding the cluster's session"
SERVING = "serving a relayed connection to the cluster's API"


@pytest.fixture(scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    directory = tmp_path_factory.mktemp("replicas-join")
    async with world(directory, replicas=2, pools=False, process_tasks=True) as started:
        await _join(started)
        yield started


def _env(w: World, replica: str) -> dict[str, str]:
    return {**w.cli_env(replica), "KUBECONFIG": str(w.sandbox.state.dir / "kubeconfig")}


async def _run(w: World, replica: str, *argv: str, stdin: str | None = None) -> str:
    done = await _completed(w, replica, *argv, stdin=stdin)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


async def _completed(
    w: World, replica: str, *argv: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        list(argv),
        input=stdin,
        env=_env(w, replica),
        capture_output=True,
        text=True,
        timeout=180,
    )


async def _join(w: World) -> None:
    assert w.balancer is not None
    applied = await _run(
        w, "a", str(BIN / "levers9"), "cluster", "join", "--name", NAME,
        "--gpu-type", "RTXPro6000", "--node-selector", SELECTOR, "--worker-image", IMAGE,
        "--gateway", w.balancer,
    )  # fmt: skip
    await _run(w, "a", "kubectl", "apply", "-f", "-", stdin=applied)


async def _routes(w: World) -> list[ClusterRoute]:
    assert w.client is not None
    return await TemporalClusterRoutes(w.client, w.settings.task_queue).routes(NAME)


async def _holder(w: World, among: tuple[str, ...] = ("a", "b")) -> str:
    """The replica whose route is the latest recorded, once it is one of `among`."""
    queues = {w.replica_queue(r): r for r in among}

    async def recorded() -> bool:
        routes = await _routes(w)
        return bool(routes) and routes[0].task_queue in queues

    await eventually(recorded, within=SETTLE_S)
    return queues[(await _routes(w))[0].task_queue]


async def _available(w: World) -> list[WorkerRecord]:
    records = await list_worker_records(w.settings, NAME, include_ended=False)
    return [r for r in records if r.state == "available"]


async def _three_workers(w: World) -> None:
    async def three() -> bool:
        return len(await _available(w)) == 3

    await eventually(three, within=SETTLE_S)


async def _pass_completed_on(w: World, replica: str) -> bool:
    """A completed reconcile pass of the pool whose observe activity ran in this replica's
    process (its pid is the Temporal worker's identity)."""
    assert w.client is not None
    identity = f"{w.replicas[replica].pid}@"
    query = (
        f"WorkflowType = 'ReconcilePoolWorkflow' AND PoolName = '{NAME}'"
        " AND ExecutionStatus = 'Completed'"
    )
    async for execution in w.client.list_workflows(query, limit=30):
        handle = w.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            started = event.activity_task_started_event_attributes
            if event.HasField("activity_task_started_event_attributes") and (
                started.identity.startswith(identity)
            ):
                return True
    return False


def _log_since_start(w: World, replica: str) -> str:
    """The replica's log since its latest start."""
    process = w.replicas[replica]
    return process.log.read_text().rsplit(f"--- start {process.starts} ---", 1)[-1]


async def _task_succeeds(w: World, replica: str, text: str) -> None:
    """A task on the pool, submitted through this replica's gateway, succeeds; its output is
    read from its record (the CLI's live stream may end before it drains on a busy machine)."""
    out = await _run(w, replica, str(BIN / "levers9"), "run", "--pool", NAME, "--gpus", "1",
                     "--", "echo", text)  # fmt: skip
    task_id = out.split()[1]
    assert w.client is not None
    record = await task_record(w.client, task_id)
    assert record is not None
    assert (record.state, record.pool_name) == ("succeeded", NAME), record
    assert text in record.log_tail, record


async def test_the_replica_without_the_session_reaches_the_cluster_through_the_holder(
    pair: World,
) -> None:
    holder = await _holder(pair)
    other = next(r for r in pair.replicas if r != holder)
    await _three_workers(pair)
    # A reconcile pass of the joined pool, with its Kubernetes calls, done by the other replica.
    await eventually(lambda: _pass_completed_on(pair, other), within=SETTLE_S)
    other_log = _log_since_start(pair, other)
    assert RELAYING in other_log
    assert f"replica={pair.gateways[holder]}" in other_log
    assert "cluster agent connected" not in other_log, "the session is on the holder only"
    assert "joined pool loaded for a call here" in other_log, "joined while it ran: loaded late"
    holder_log = _log_since_start(pair, holder)
    assert "cluster agent connected" in holder_log
    assert f"relayed_by={pair.replica_queue(other)}" in holder_log
    assert SERVING in holder_log
    assert RELAYING not in holder_log, "the holder uses its own session"
    for replica in (other, holder):
        await _task_succeeds(pair, replica, f"via-{replica}")


async def test_kill9_of_the_holder_the_agent_redials_and_calls_go_on(pair: World) -> None:
    holder = await _holder(pair)
    survivor = next(r for r in pair.replicas if r != holder)
    await _three_workers(pair)
    pair.replicas[holder].kill9()
    assert await _holder(pair, among=(survivor,)) == survivor
    assert "cluster agent connected" in _log_since_start(pair, survivor)
    await _three_workers(pair)
    await _task_succeeds(pair, survivor, "after-the-kill")

    # The killed replica, started again, holds no session: it relays to the survivor.
    pair.replicas[holder].start()
    await pair.controlplane_ready(pair.replicas[holder])
    await eventually(lambda: _pass_completed_on(pair, holder), within=SETTLE_S)
    log = _log_since_start(pair, holder)
    assert f"replica={pair.gateways[survivor]}" in log, "relayed to the survivor"
    assert "cluster agent connected" not in log
    await _task_succeeds(pair, holder, "after-the-restart")
