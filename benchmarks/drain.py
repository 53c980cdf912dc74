"""A drain of a node with 4 tasks and 1 box: the time from `kubectl drain NODE` until all of them
run again on other nodes, on the sandbox's pool with real agents (runc tasks, a runsc box),
an S3 that checks credentials (moto) for the box's checkpoint volume, and the real kubectl.

    python benchmarks/drain.py [--dir DIR]

The pool's three machines (1, 2 and 2 free cards); the other two nodes are cordoned (their
workers drain away) so that the four `--gpus 0 --retries 1` tasks and the `--runtime runsc
--checkpoints ckpt` box (counting in its memory) all land on one; then they are uncordoned and
their new workers awaited. Then `kubectl drain` of the loaded node, timed to:

- `drain_s`: kubectl drain's exit (the PodDisruptionBudget holds it until the agent has given
  its work back: tasks requeued, the box checkpointed and its image uploaded),
- `tasks_s`: each task's second attempt running on another node (max over the four),
- `box_s`: the box's task running on another node, restored from its checkpoint (the
  controlplane starts it again after a drain; if it reads stopped, this script runs
  `box start` and says so), and its counter going on from where it was.

Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from levers9.core.capacity import NODE_LABEL
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from levers9.temporal import connect, ensure_search_attributes
from tests.buckets import checking_s3
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

BIN = Path(sys.executable).parent
WITHIN = 300
TEAM = "drainers"
BUCKET = "levers9-drainers"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    if done.returncode != 0:
        raise SystemExit(f"{done.args}: {done.stdout}{done.stderr}")
    return done.stdout


async def _nodes(cp: Controlplane) -> list[str]:
    return sorted({job["metadata"]["labels"][NODE_LABEL] for job in await cp.worker_jobs()})


async def _workers_on(cp: Controlplane, nodes: list[str]) -> bool:
    live = await list_worker_records(cp.settings, POOL, include_ended=False)
    return all(any(r.node_name == n and r.state == "available" for r in live) for n in nodes)


async def measure(env: WorkflowEnvironment, root: Path) -> dict[str, Any]:
    runtimes = {"runtimes": ["runc", "runsc"]}
    with checking_s3(root / "moto.log") as s3:
        s3.client().create_bucket(Bucket=BUCKET)
        credentials = root / "team-credentials"
        credentials.write_text(
            f"[default]\naws_access_key_id = {s3.allowed.access_key_id}\n"
            f"aws_secret_access_key = {s3.allowed.secret_access_key}\n"
        )
        async with reconciling(env.client, root, pool_settings=runtimes, containers=True) as cp:
            await eventually(lambda: workers_available(cp), within=WITHIN)
            _ok(await cp.cli("workspace", "create", TEAM))
            token = _ok(await cp.cli("workspace", "token", "create", TEAM)).strip()

            async def cli(*args: str) -> subprocess.CompletedProcess[str]:
                return await cp.cli(*args, token=token)

            _ok(
                await cli(
                    *("volume", "create", "ckpt", "--bucket", f"s3://{BUCKET}/team"),
                    *("--endpoint", s3.endpoint, "--credentials-file", str(credentials)),
                )
            )
            nodes = await _nodes(cp)
            loaded, others = nodes[-1], nodes[:-1]
            for node in others:
                await cp.kubectl("cordon", node)
            await eventually(lambda: _workers_on(cp, [loaded]), within=WITHIN)

            async def others_gone() -> bool:
                live = await list_worker_records(cp.settings, POOL, include_ended=False)
                return all(r.node_name == loaded for r in live)

            await eventually(others_gone, within=WITHIN)
            tasks = [
                _ok(
                    await cli(
                        *("run", "--pool", POOL, "--gpus", "0", "--retries", "1", "--detach"),
                        *("--", "sleep", "3600"),
                    )
                ).strip()
                for _ in range(4)
            ]
            _ok(
                await cli(
                    *("box", "create", "counter", "--pool", POOL, "--gpus", "0"),
                    *("--runtime", "runsc", "--checkpoints", "ckpt", "--", "sh", "-c", COUNTER),
                )
            )
            client = await connect(cp.settings)

            async def box() -> dict[str, Any]:
                shown: dict[str, Any] = json.loads(
                    _ok(await cli("box", "get", "counter", "-o", "json"))
                )
                return shown

            async def all_running_on(node: str) -> bool:
                records = [await task_record(client, t) for t in tasks]
                shown = await box()
                return all(r is not None and r.state == "running" for r in records) and (
                    shown["task_state"] == "running" and shown["node"] == node
                )

            await eventually(lambda: all_running_on(loaded), within=WITHIN)

            async def count() -> int:
                done = await cli("box", "exec", "counter", "--", "cat", "/tmp/count")
                return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0

            async def counting() -> bool:
                return await count() >= 5

            await eventually(counting, within=WITHIN)
            for node in others:
                await cp.kubectl("uncordon", node)
            await eventually(lambda: _workers_on(cp, others), within=WITHIN)

            kubeconfig = str(cp.sandbox.state.dir / "kubeconfig")
            began = time.monotonic()
            drain = await asyncio.create_subprocess_exec(
                *("kubectl", "--kubeconfig", kubeconfig, "drain", loaded),
                *("--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=600s"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )

            async def drain_exit() -> tuple[bytes, float]:
                out, _ = await drain.communicate()
                return out, time.monotonic() - began

            drained = asyncio.create_task(drain_exit())
            task_s: dict[str, float] = {}
            box_s: float | None = None
            started_by_hand = False
            last_count = 0
            while len(task_s) < len(tasks) or box_s is None:
                if time.monotonic() - began > 900:
                    raise SystemExit(f"not all running again: tasks {task_s}, box {box_s}")
                for task_id in tasks:
                    record = await task_record(client, task_id)
                    if (
                        task_id not in task_s
                        and record is not None
                        and record.state == "running"
                        and record.attempts
                        and record.node_name != loaded
                    ):
                        task_s[task_id] = time.monotonic() - began
                if box_s is None:
                    shown = await box()
                    if shown["state"] == "stopped" and drained.done() and not started_by_hand:
                        await asyncio.sleep(5)  # the controlplane's own start, if it comes
                        if (await box())["state"] == "stopped":
                            _ok(await cli("box", "start", "counter"))
                            started_by_hand = True
                    if shown["task_state"] == "running" and shown["node"] not in ("", loaded):
                        last_count = await count()
                        if last_count:
                            box_s = time.monotonic() - began
                await asyncio.sleep(0.2)
            out, drain_s = await drained
            return {
                "drain_exit": drain.returncode,
                "drain_output_tail": out.decode(errors="replace").splitlines()[-3:],
                "drain_s": round(drain_s, 1),
                "tasks_s": sorted(round(v, 1) for v in task_s.values()),
                "box_s": round(box_s, 1),
                "box_started_by_hand": started_by_hand,
                "box_count_after": last_count,
            }


async def run(root: Path) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
        dev_server_startup_timeout=timedelta(seconds=60),
    )
    async with env:
        await ensure_search_attributes(env.client, "default")
        result = await measure(env, root)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        **result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="kept; else a temporary directory, removed")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="l9-drain-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(json.dumps(asyncio.run(run(root)), indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
