"""worker_main.py against the dev server: the spec's `loaded controller` line per pool, the
`unable to load controller` line for a pool of another provider (the others still load), a
schedule per loaded pool, no secret in its output, and a clean exit on SIGTERM; restarted
without a pool's block, its schedule is deleted and its removal runs (`remove:<pool>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from temporalio.client import ScheduleActionStartWorkflow
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from levers9.config import ControlplaneSettings
from levers9.operations import start_pool_removal
from levers9.providers.gke import RemovePoolResult
from tests.factories import (
    MARKER,
    free_port,
    private_values,
    spec_pool,
    values_doc,
    write_json,
    write_yaml,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration

STARTED = "temporal worker started"
READ_TIMEOUT_S = 60


async def _worker_main(env: dict[str, str], *values: Path) -> asyncio.subprocess.Process:
    """`python -m worker_main --values ...`, its stderr piped."""
    args = [arg for path in values for arg in ("--values", str(path))]
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker_main", *args, env=env, stderr=asyncio.subprocess.PIPE
    )


async def _read_until(stream: asyncio.StreamReader, needle: str) -> str:
    seen: list[str] = []
    async with asyncio.timeout(READ_TIMEOUT_S):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError("worker_main exited early:\n" + "".join(seen))
            seen.append(line)
            if needle in line:
                return "".join(seen)


async def test_loads_pools_keeps_schedules_and_stops_on_sigterm(
    dev_env: WorkflowEnvironment, tmp_path: Path, task_queue: str
) -> None:
    values = write_yaml(
        tmp_path / "values.yaml",
        values_doc(
            {"gke-rtx6000": spec_pool(), "old-aws": {"mode": "external", "provider": "aws"}}
        ),
    )
    private = write_json(tmp_path / "private.json", private_values())
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "LEVERS9_TASK_QUEUE": task_queue,
        "LEVERS9_WORKER_TOKEN_SECRET": MARKER,
        "LEVERS9_GATEWAY_LISTEN": f"127.0.0.1:{free_port()}",
        "LEVERS9_ENDPOINTS_LISTEN": f"127.0.0.1:{free_port()}",
    }
    proc = await _worker_main(env, values, private)
    assert proc.stderr is not None
    try:
        output = await _read_until(proc.stderr, STARTED)
        assert (
            " loaded controller gpu_type=RTXPro6000 mode=external pool_name=gke-rtx6000\n" in output
        )
        assert ' unable to load controller error="invalid provider name" pool_name=old-aws\n' in (
            output
        )
        described = await dev_env.client.get_schedule_handle("reconcile:gke-rtx6000").describe()
        action = described.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.task_queue == task_queue
        proc.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(proc.stderr.read(), 20)).decode()
        assert await asyncio.wait_for(proc.wait(), 5) == 0
        assert "shutting down" in rest
        assert MARKER not in output + rest

        # The pool's block leaves the values: its schedule goes, and its removal runs.
        without = write_yaml(
            tmp_path / "without.yaml",
            values_doc({"old-aws": {"mode": "external", "provider": "aws"}}),
        )
        proc = await _worker_main(env, without)
        assert proc.stderr is not None
        output = await _read_until(proc.stderr, STARTED)
        assert " removing pool pool_name=gke-rtx6000 workflow_id=remove:gke-rtx6000\n" in output
        handle = dev_env.client.get_workflow_handle(
            "remove:gke-rtx6000", result_type=RemovePoolResult
        )
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.schedule_deleted is False  # the sync had deleted it already
        assert "delete the levers9 namespace there" in result.note
        with pytest.raises(RPCError):
            await dev_env.client.get_schedule_handle("reconcile:gke-rtx6000").describe()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(RPCError):
            await dev_env.client.get_schedule_handle("reconcile:gke-rtx6000").delete()


async def test_bad_values_file_exits_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "values.yaml"
    bad.write_text("config:\n  worker:\n    pools: [1]\n")
    proc = await _worker_main(dict(os.environ), bad)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert 'invalid values error="config.worker.pools: must be a map"' in err.decode()


async def test_pools_without_a_token_secret_exit_naming_the_setting(tmp_path: Path) -> None:
    values = write_yaml(tmp_path / "values.yaml", values_doc({"gke-rtx6000": spec_pool()}))
    private = write_json(tmp_path / "private.json", private_values())
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_WORKER_TOKEN")}
    proc = await _worker_main(env, values, private)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "config.controlplane.workerTokenSecret: required to start workers" in err.decode()


DOCUMENTED_METRICS = (
    "temporal_workflow_task_schedule_to_start_latency",
    "temporal_activity_schedule_to_start_latency",
    "temporal_worker_task_slots_available",
    "temporal_worker_task_slots_used",
    "temporal_workflow_task_execution_latency",
    "temporal_activity_execution_latency",
    "temporal_num_pollers",
    "temporal_request",
    "temporal_request_latency",
    "temporal_workflow_completed",
)
"""The metrics docs/operations.md names (a histogram shows as its _bucket, _sum and _count)."""


def _metric(text: str, name: str, task_queue: str) -> float:
    """The sum of metric `name`'s samples on `task_queue` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and f'task_queue="{task_queue}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_serves_temporal_metrics_that_grow_as_workflows_run(
    dev_env: WorkflowEnvironment, tmp_path: Path, task_queue: str
) -> None:
    """LEVERS9_METRICS_ADDRESS: worker_main serves the SDK's metrics in Prometheus format; a
    workflow and its activities run on it (a pool's removal, twice) count in them."""
    values = write_yaml(tmp_path / "values.yaml", values_doc({}))
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "LEVERS9_TASK_QUEUE": task_queue,
        "LEVERS9_METRICS_ADDRESS": address,
        "LEVERS9_WORKER_TOKEN_SECRET": MARKER,
        "LEVERS9_GATEWAY_LISTEN": f"127.0.0.1:{free_port()}",
        "LEVERS9_ENDPOINTS_LISTEN": f"127.0.0.1:{free_port()}",
    }
    settings = ControlplaneSettings.model_validate(
        {"temporalAddress": env["TEMPORAL_ADDRESS"], "taskQueue": task_queue}
    )
    proc = await _worker_main(env, values)
    assert proc.stderr is not None
    try:
        await _read_until(proc.stderr, STARTED)
        async with aiohttp.ClientSession() as http:

            async def scrape() -> str:
                async with http.get(f"http://{address}/metrics") as response:
                    assert response.status == 200
                    assert response.content_type == "text/plain"
                    return await response.text()

            async def removed(times: int) -> str:
                """The scrape once `times` removals completed and their activities ran."""
                text = ""

                async def counted() -> bool:
                    nonlocal text
                    text = await scrape()
                    latency = "temporal_activity_execution_latency_count"
                    return (
                        _metric(text, "temporal_workflow_completed", task_queue) == times
                        and _metric(text, latency, task_queue) >= 3 * times
                    )

                await eventually(counted, within=30)
                return text

            before = ""

            async def polling() -> bool:
                # The pollers' gauge is set once the first poll goes out, a moment after start.
                nonlocal before
                before = await scrape()
                return _metric(before, "temporal_num_pollers", task_queue) > 0

            await eventually(polling, within=30)
            assert _metric(before, "temporal_workflow_completed", task_queue) == 0
            for times in (1, 2):
                handle = await start_pool_removal(dev_env.client, settings, f"gone-{times}")
                await asyncio.wait_for(handle.result(), 60)
                after = await removed(times)
            names = {line.split("{")[0].split(" ")[0] for line in after.splitlines()}
            for name in DOCUMENTED_METRICS:
                assert {name, f"{name}_count"} & names, name
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
