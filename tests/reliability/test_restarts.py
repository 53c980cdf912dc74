"""Restarts and faults around a running controlplane (worker_main as its own process):

- Kubernetes faults through the sandbox's admin endpoint: 429 (with Retry-After), 500 and
  dropped connections on list, create and delete are retried, and nothing is duplicated: one
  Job per node, the records match. (A 403 stopping reconcile with the actionable line, and
  resuming by itself once cleared, is tests/integration/test_reconcile_sandbox.py's.)
- The gateway restarts (worker_main stopped and started): the workers' records continue (same
  workers, heartbeats arriving again, no new Job).
- A worker gone silent (its agent stopped with SIGSTOP) expires after the record TTL: its Job
  deleted, a fresh worker on that node.
- The Temporal dev server is killed and restarted on the same sqlite file mid-flow: the task in
  flight completes once, the workflows resume and the reconcile schedule keeps firing.
- Tunnel mode: after a gateway restart every worker opens its tunnel again and registers again.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is restarts of the controlplane, the gateway and Temporal, a task's
runs counted in a host file (w.task_command), not the container a task runs in
(tests/integration/test_tasks_sandbox.py runs tasks as a user does, in containers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from levers9.core.capacity import NODE_LABEL, WORKER_ID_LABEL
from levers9.models import TERMINAL, TaskInput, reconcile_schedule_id, worker_workflow_id
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task, task_record
from sandbox.admin_client import SandboxAdmin
from tests.controlplane import POOL, admin_api
from tests.factories import add_gpu_node
from tests.reliability.world import World, agent_pid, live, passes_after, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration

TTL_MINUTES = "0.75"  # 45 s: a silent worker expires in the test, a restart under load does not


@pytest.fixture(scope="module")
async def plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(
        tmp_path_factory.mktemp("restarts"),
        LEVERS9_WORKER_RECORD_TTL_MINUTES=TTL_MINUTES,
        process_tasks=True,
    ) as started:
        await settled(started)
        yield started


def _admin(w: World) -> SandboxAdmin:
    return SandboxAdmin(w.sandbox.state.dir)


def _count(requests: dict[str, object], verb: str, resource: str) -> int:
    counts = requests["counts"]
    assert isinstance(counts, list)
    return sum(c["count"] for c in counts if c["verb"] == verb and c["resource"] == resource)


async def _workers(w: World) -> dict[str, str]:
    """Running worker records: worker id -> node."""
    records = await list_worker_records(w.settings, POOL, include_ended=False)
    return {r.worker_id: r.node_name for r in records}


async def test_kubernetes_faults_are_retried_without_duplicates(plane: World) -> None:
    admin = _admin(plane)
    await asyncio.to_thread(admin.reset_requests)
    for rule in (
        # A pass reads the watch-fed cache, after one GET proving the cluster answers.
        {"verb": "get", "resource": "namespaces", "status": 500, "times": 2},
        {"verb": "list", "resource": "pods", "drop": True, "delaySeconds": 1, "times": 1},
        {"verb": "create", "resource": "jobs", "status": 429, "retryAfterSeconds": 1, "times": 2},
        {"verb": "create", "resource": "jobs", "status": 500, "times": 1},
        {"verb": "create", "resource": "jobs", "drop": True, "delaySeconds": 1, "times": 1},
        {"verb": "delete", "resource": "jobs", "status": 500, "times": 1},
        {"verb": "delete", "resource": "jobs", "status": 429, "retryAfterSeconds": 1, "times": 1},
    ):
        await asyncio.to_thread(admin.add_fault, rule)
    name = "gke-demo-gpu-faulty-1"
    await add_gpu_node(plane.sandbox.cluster, name, 2, "127.0.12.1", "127.0.22.1")
    await settled(plane)
    # A create retried after the first moment of one Job per node would make a second one:
    # the passes after it had their chance.
    await passes_after(plane)
    jobs = [j for j in await plane.worker_jobs() if j["metadata"]["labels"][NODE_LABEL] == name]
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    # Removing the node deletes its worker's Job through the delete faults.
    await plane.sandbox.cluster.remove_node(name)
    await settled(plane)
    requests = await asyncio.to_thread(admin.requests)
    rules = await asyncio.to_thread(admin.call, "GET", "/_sandbox/faults")
    fired = {(r["verb"], r["resource"], r["status"], r["drop"]): r["fired"] for r in rules["rules"]}
    assert all(count >= 1 for count in fired.values()), fired
    # Every create that failed was tried again, and still one Job was made for the node.
    assert _count(requests, "create", "jobs") >= 5
    await asyncio.to_thread(admin.clear_faults)


async def test_gateway_restart_keeps_the_records(plane: World) -> None:
    before = await _workers(plane)
    jobs_before = {j["metadata"]["name"] for j in await plane.worker_jobs() if live(j)}
    restarted = datetime.now(UTC)
    failed = await asyncio.to_thread(_heartbeats_failed, plane)
    plane.controlplane.stop()

    async def felt() -> bool:  # every worker's heartbeat met the stopped gateway
        now = await asyncio.to_thread(_heartbeats_failed, plane)
        return all(now.get(worker, 0) > failed.get(worker, 0) for worker in before)

    await eventually(felt, within=60)
    plane.controlplane.start()
    await plane.controlplane_ready()

    async def heard_again() -> bool:
        records = await list_worker_records(plane.settings, POOL, include_ended=False)
        return bool(records) and all(
            r.last_heartbeat is not None and r.last_heartbeat > restarted for r in records
        )

    await eventually(heard_again, within=90)
    await passes_after(plane)  # the restarted process's own passes, before comparing
    assert await _workers(plane) == before
    assert {j["metadata"]["name"] for j in await plane.worker_jobs() if live(j)} == jobs_before


def _heartbeats_failed(w: World) -> dict[str, int]:
    """'heartbeat failed' lines in each worker agent's log (its pod's), by worker id."""
    core: Any = k8s.CoreV1Api(admin_api(w.sandbox))
    pods = core.list_namespaced_pod("levers9", label_selector=WORKER_ID_LABEL).items
    return {
        pod.metadata.labels[WORKER_ID_LABEL]: core.read_namespaced_pod_log(
            pod.metadata.name, "levers9"
        ).count("heartbeat failed")
        for pod in pods
    }


async def test_a_silent_worker_expires_and_is_replaced(plane: World) -> None:
    workers = await _workers(plane)
    worker_id, node = sorted(workers.items())[0]
    pid = await asyncio.to_thread(agent_pid, worker_id)
    os.kill(pid, signal.SIGSTOP)
    try:

        async def expired() -> bool:
            records = await list_worker_records(plane.settings, POOL, include_ended=True)
            mine = [r for r in records if r.worker_id == worker_id]
            return bool(mine) and mine[0].state == "expired"

        await eventually(expired, within=90)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its Job deleted, the agent killed
            os.kill(pid, signal.SIGCONT)
    records = await list_worker_records(plane.settings, POOL, include_ended=True)
    [gone] = [r for r in records if r.worker_id == worker_id]
    assert gone.reason == "no heartbeat within the record TTL"
    await settled(plane)
    now = await _workers(plane)
    assert worker_id not in now
    assert node in now.values()  # a fresh worker on the same node


async def test_temporal_server_restart_mid_flow(plane: World) -> None:
    assert plane.client is not None
    task_id = "restart-mid-flow"
    await start_task(
        plane.client,
        plane.settings.task_queue,
        TaskInput(
            task_id=task_id,
            pool_name=POOL,
            command=("sh", "-c", f"echo run >> {plane.task_runs / task_id}; sleep 4; echo done"),
        ),
    )

    async def running() -> bool:
        assert plane.client is not None
        record = await task_record(plane.client, task_id)
        return record is not None and record.state == "running"

    await eventually(running, within=60)
    schedule = plane.client.get_schedule_handle(reconcile_schedule_id(POOL))
    actions_before = (await schedule.describe()).info.num_actions
    plane.temporal.kill9()  # gone (waited for) until it serves again: its absence
    plane.temporal.start()
    client = await plane.temporal_ready()

    async def ended() -> bool:
        record = await task_record(client, task_id)
        return record is not None and record.state in TERMINAL

    await eventually(ended, within=90)
    record = await task_record(client, task_id)
    assert record is not None
    assert (record.state, record.reason) == ("succeeded", "")
    assert plane.runs(task_id) == 1
    schedule = client.get_schedule_handle(reconcile_schedule_id(POOL))

    async def firing() -> bool:
        return (await schedule.describe()).info.num_actions >= actions_before + 3

    await eventually(firing, within=30)
    assert plane.controlplane.alive()  # it rode out the server's absence
    await settled(plane)


async def _registrations(w: World, workers: dict[str, str]) -> Counter[str]:
    """How many times each worker registered: `register` signals in its record's history."""
    assert w.client is not None
    counts: Counter[str] = Counter()
    for worker_id in workers:
        history = await w.client.get_workflow_handle(
            worker_workflow_id(POOL, worker_id)
        ).fetch_history()
        counts[worker_id] = sum(
            1
            for event in history.events
            if event.HasField("workflow_execution_signaled_event_attributes")
            and event.workflow_execution_signaled_event_attributes.signal_name == "register"
        )
    return counts


async def test_tunnel_workers_open_their_tunnels_again_after_a_gateway_restart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    async with world(
        tmp_path_factory.mktemp("tunnel-restart"), tunnel=True, process_tasks=True
    ) as w:
        await settled(w)
        before = await _workers(w)
        registrations = await _registrations(w, before)
        w.controlplane.stop()  # every tunnel cut with it (it has exited)
        w.controlplane.start()
        await w.controlplane_ready()

        async def registered_again() -> bool:
            now = await _registrations(w, before)
            return all(now[worker] > registrations[worker] for worker in before)

        await eventually(registered_again, within=90)
        await settled(w)
        assert await _workers(w) == before
