"""Every replica down at once: two controlplane replicas (worker_main `a` and `b` behind the
gateway's balancer) both killed with -9 while every kind of live state is present (a joined
cluster with a task running on it, running and queued tasks, an endpoint with a replica, a paused
pool; tests/reliability/restart_state.py), then both started again, as a rollout or a region
failover does. Neither can lean on the other while starting: each comes up, and each kind of
state comes back and keeps working, nothing run twice.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is records that survive a restart of both replicas (restart_state.py
counts runs in host files), not the container a task runs in
(tests/integration/test_tasks_sandbox.py runs tasks as a user does, in containers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.reliability.restart_state import came_back, made
from tests.reliability.world import World, settled, world

pytestmark = pytest.mark.integration


@pytest.fixture  # one test: a rerun (pytest-rerunfailures) gets a world of its own
async def pair(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(
        tmp_path_factory.mktemp("restart-replicas"), replicas=2, process_tasks=True
    ) as started:
        await settled(started)
        yield started


async def test_both_replicas_killed_at_once_come_back_with_everything(pair: World) -> None:
    before = await made(pair)
    for process in pair.replicas.values():
        process.kill9()
    for process in pair.replicas.values():
        process.start()
    for process in pair.replicas.values():
        await pair.controlplane_ready(process)
    await came_back(pair, before)
    for replica, process in pair.replicas.items():
        log = process.log.read_text().split("--- start 2 ---")[1]
        assert "temporal worker started" in log, (replica, log[-3000:])
        assert process.alive(), f"replica {replica} stayed up"
