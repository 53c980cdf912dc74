"""Settings changed on the controlplane reach what already runs: the controlplane restarts with
`workerIdleMinutes` cut from an hour to six seconds (as a `helm upgrade` with new values does),
and the workers that were started under the hour, idle, wind down within seconds, told through
their machines by the first pass with the new values.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9 import logs
from levers9.records.listing import list_worker_records
from levers9.temporal import sync_reconcile_schedules
from tests.controlplane import POOL, controlplane, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def log_lines() -> io.StringIO:
    stream = io.StringIO()
    logs.setup("INFO", stream)
    return stream


async def test_new_idle_minutes_reach_the_running_workers(
    dev_env: WorkflowEnvironment, tmp_path: Path, log_lines: io.StringIO
) -> None:
    client = dev_env.client
    task_queue = f"tq-settings-{tmp_path.name[-8:]}"
    async with controlplane(
        tmp_path,
        client.service_client.config.target_host,
        task_queue,
        settings={"workerIdleMinutes": 60},
    ) as plane:
        async with plane.worker(client, keep_records=True):
            await sync_reconcile_schedules(client, [POOL], plane.settings)
            await eventually(lambda: workers_available(plane), within=60)
            before = {
                r.worker_id
                for r in await list_worker_records(plane.settings, POOL, include_ended=False)
            }
            assert len(before) == 3
        # The restart: same queue, same records, the idle minutes now a tenth.
        plane.settings = plane.settings.model_copy(update={"worker_idle_minutes": 0.1})
        async with plane.worker(client):
            try:

                async def wound_down() -> bool:
                    records = await list_worker_records(plane.settings, POOL, include_ended=True)
                    ended = {
                        r.worker_id: (r.state, r.reason) for r in records if r.worker_id in before
                    }
                    return len(ended) == 3 and all(
                        state == ("stopped", "idle wind-down") for state in ended.values()
                    )

                # An hour's idle minutes would keep them far past this.
                await eventually(wound_down, within=60)
                assert "settings changed: told the running machines" in log_lines.getvalue()
                assert "machines=3" in next(
                    line
                    for line in log_lines.getvalue().splitlines()
                    if "settings changed: told the running machines" in line
                )
            finally:
                await sync_reconcile_schedules(client, [], plane.settings)
