"""Soak: node churn and a task stream against a running controlplane for a long while (an hour
by default), sampling the Temporal worker process's memory and CPU and the history sizes of the
long-lived workflows. The targets: memory flat (RSS of the last quarter within 15% of the second
quarter's), every history bounded (continue-as-new keeps each run under its cap), every task
run exactly once.

    python benchmarks/soak.py [--minutes 60] [--interval 2] [--sample 30]

What runs is tests/reliability/world.py's world: the Temporal dev server (sqlite) and
`python -m worker_main` as their own processes, the sandbox cluster in this one. Every ~20 s a
random change to the cluster (a 1-, 2- or 4-card node added, an added node removed, a node
NotReady for a moment); every ~5 s a one-card task (`sh -c 'echo run >> ...; sleep 1'`). Not
part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from levers9 import logs
from levers9.models import TERMINAL, TaskInput
from levers9.records.tasks import start_task, task_record
from tests.controlplane import POOL
from tests.factories import add_gpu_node
from tests.reliability.world import World, world

LONG_LIVED = ("PoolWorkflow", "MachineWorkflow", "WorkerWorkflow", "EgressAllowlistWorkflow")


@dataclass
class Sample:
    at_s: float
    rss_mib: float
    cpu_s: float
    histories: dict[str, int]
    """Longest current run's history length per long-lived workflow type."""


@dataclass
class Soak:
    w: World
    rng: random.Random
    samples: list[Sample] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    churn: dict[str, int] = field(default_factory=dict)
    added: int = 0

    def process_figures(self) -> tuple[float, float]:
        pid = self.w.controlplane.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kib = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")
        )
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return rss_kib / 1024, (int(fields[11]) + int(fields[12])) / ticks

    async def histories(self) -> dict[str, int]:
        assert self.w.client is not None
        longest: dict[str, int] = {}
        query = f"TaskQueue='{self.w.settings.task_queue}' AND ExecutionStatus='Running'"
        async for listed in self.w.client.list_workflows(query):
            kind = listed.workflow_type
            if kind in LONG_LIVED:
                # Visibility does not carry a running run's length; the run's own description does.
                handle = self.w.client.get_workflow_handle(listed.id, run_id=listed.run_id)
                length = (await handle.describe()).raw_description.workflow_execution_info
                longest[kind] = max(longest.get(kind, 0), length.history_length)
        return longest

    async def change_the_cluster(self) -> None:
        cluster = self.w.sandbox.cluster
        added = [s.name for s in cluster.node_specs() if "-soak-" in s.name]
        action = self.rng.choice(["add", "add", "remove", "not-ready"])
        if action == "remove" and added:
            await cluster.remove_node(self.rng.choice(added))
        elif action == "not-ready":
            name = self.rng.choice([s.name for s in cluster.node_specs() if s.gpus.count])
            await cluster.set_node_ready(name, False)
            await asyncio.sleep(self.rng.uniform(1, 5))
            await cluster.set_node_ready(name, True)
        elif len(added) < 6:
            self.added += 1
            host = self.added % 250 + 1
            await add_gpu_node(
                cluster,
                f"gke-demo-gpu-soak-{self.added}",
                self.rng.choice([1, 2, 4]),
                f"127.0.13.{host}",
                f"127.0.23.{host}",
            )
        else:
            action = "none"
        self.churn[action] = self.churn.get(action, 0) + 1

    async def submit(self) -> None:
        assert self.w.client is not None
        task_id = f"soak{len(self.tasks):05d}"
        await start_task(
            self.w.client,
            self.w.settings.task_queue,
            TaskInput(task_id=task_id, pool_name=POOL, command=self.w.task_command(task_id)),
        )
        self.tasks.append(task_id)


async def run(minutes: float, interval: float, sample_every: float) -> dict[str, object]:
    logs.setup("WARNING", sys.stderr)
    with tempfile.TemporaryDirectory(prefix="levers9-soak-") as scratch:
        async with world(Path(scratch), LEVERS9_RECONCILE_INTERVAL_SECONDS=str(interval)) as w:
            soak = Soak(w, random.Random(7))
            start = time.monotonic()
            next_churn, next_task, next_sample = start + 20, start + 5, start
            while (now := time.monotonic()) < start + minutes * 60:
                if now >= next_sample:
                    rss, cpu = soak.process_figures()
                    soak.samples.append(Sample(now - start, rss, cpu, await soak.histories()))
                    print(
                        f"+{now - start:6.0f}s rss={rss:.0f}MiB cpu={cpu:.0f}s"
                        f" tasks={len(soak.tasks)} histories={soak.samples[-1].histories}",
                        file=sys.stderr,
                    )
                    next_sample += sample_every
                if now >= next_churn:
                    await soak.change_the_cluster()
                    next_churn += soak.rng.uniform(15, 25)
                if now >= next_task:
                    await soak.submit()
                    next_task += soak.rng.uniform(3, 7)
                await asyncio.sleep(0.5)
            # Let the stream finish, then count.
            records = {}
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                records = {t: await task_record(w.client, t) for t in soak.tasks}  # type: ignore[arg-type]
                if all(r is not None and r.state in TERMINAL for r in records.values()):
                    break
                await asyncio.sleep(2)
            states: dict[str, int] = {}
            for r in records.values():
                key = r.state if r is not None else "unknown"
                states[key] = states.get(key, 0) + 1
            runs = {t: w.runs(t) for t in soak.tasks}
            quarter = max(1, len(soak.samples) // 4)
            second = [s.rss_mib for s in soak.samples[quarter : 2 * quarter]] or [0.0]
            last = [s.rss_mib for s in soak.samples[-quarter:]]
            longest: dict[str, int] = {}
            for s in soak.samples:
                for kind, length in s.histories.items():
                    longest[kind] = max(longest.get(kind, 0), length)
            return {
                "minutes": minutes,
                "reconcile_interval_s": interval,
                "nproc": os.cpu_count(),
                "samples": len(soak.samples),
                "rss_mib_first": round(soak.samples[0].rss_mib, 1),
                "rss_mib_second_quarter_median": round(statistics.median(second), 1),
                "rss_mib_last_quarter_median": round(statistics.median(last), 1),
                "rss_mib_max": round(max(s.rss_mib for s in soak.samples), 1),
                "rss_growth_last_vs_second_quarter": round(
                    statistics.median(last) / statistics.median(second) - 1, 3
                ),
                "worker_main_cpu_s": round(soak.samples[-1].cpu_s, 1),
                "cluster_changes": soak.churn,
                "tasks": len(soak.tasks),
                "task_states": states,
                "tasks_run_not_once": {t: n for t, n in runs.items() if n != 1},
                "longest_history_by_type": longest,
                "controlplane_restarts": w.controlplane.starts - 1,
            }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--interval", type=float, default=2, help="reconcile interval, seconds")
    parser.add_argument("--sample", type=float, default=30, help="seconds between samples")
    args = parser.parse_args()
    result = asyncio.run(run(args.minutes, args.interval, args.sample))
    print(json.dumps(result, indent=2))
    ok = (
        result["rss_growth_last_vs_second_quarter"] <= 0.15  # type: ignore[operator]
        and not result["tasks_run_not_once"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
