"""kill -9 of the controlplane (one replica) with every kind of live state present: a joined
cluster with a task running on it, running and queued tasks, an endpoint with a replica, a paused
pool (tests/reliability/restart_state.py makes them). It starts again (the same process, as
Kubernetes restarts a crashed pod), and each comes back and keeps working: the start needs no
workflow to answer (the joined cluster is read from its record's memo, not by a query only a
polling Temporal worker could answer).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.reliability.restart_state import came_back, made
from tests.reliability.world import World, settled, world

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(tmp_path_factory.mktemp("restart-records")) as started:
        await settled(started)
        yield started


async def test_every_kind_of_record_comes_back_after_kill9(plane: World) -> None:
    before = await made(plane)
    plane.controlplane.kill9()
    plane.controlplane.start()
    await plane.controlplane_ready()
    assert plane.controlplane.alive(), plane.controlplane.log.read_text()[-3000:]
    await came_back(plane, before)
    log = plane.controlplane.log.read_text().split("--- start 2 ---")[1]
    assert "temporal worker started" in log, log[-3000:]
    assert plane.controlplane.alive(), "it stayed up"
    loaded = [line for line in log.splitlines() if "loaded controller" in line]
    assert any("pool_name=joined" in line for line in loaded), loaded
