"""Cache locality: submit to running for a task of a large image (1 GiB by default) on a cold and
a warm machine, with the pool's `cache.enabled` on and off, on the sandbox with real agents,
their image caches (skopeo, umoci, runc) and a local registry.

    python benchmarks/cache_locality.py [--size-mib 1024] [--dir DIR]

For each setting, a controlplane on the sandbox (3 workers: 1, 2 and 2 of 4 cards), fresh node
caches, and two tasks of the image, one after the other:

- `first`: two cards, so it lands on a two-card machine, whose cache is cold: it pulls.
- `second`: one card. With the cache on, it goes where the image is (warm: nothing pulled);
  with it off, placement takes the tightest fit, the one-card machine, cold: it pulls again.

Submit to running is from `start_task` to the first read of the record in `running` (polled
every 0.1 s); the image is busybox plus one layer of `--size-mib` random bytes (incompressible:
what a model's weights are), gzip as umoci packs it. Not part of `make test`.
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
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from levers9.core.placement import PoolState
from levers9.models import TaskInput, TaskRecord, pool_workflow_id
from levers9.records.tasks import start_task, task_record
from levers9.temporal import connect, ensure_search_attributes
from sandbox.registries import push_layout
from sandbox.task_images import build_busybox
from tests.controlplane import (
    POOL,
    WORKER_IMAGE_HOST,
    Controlplane,
    reconciling,
    workers_available,
)
from tests.waiting import eventually

BIN = Path(sys.executable).parent
NODE_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"
REPOSITORY = "demo/bench/big"


def build_image(layout: Path, size_mib: int) -> None:
    """busybox with `/data/blob` of `size_mib` random MiB as its own layer."""
    build_busybox(layout, "base")
    with tempfile.TemporaryDirectory(dir=layout.parent) as work:
        bundle = Path(work) / "bundle"
        subprocess.run(
            ["umoci", "unpack", "--image", f"{layout}:base", str(bundle)],
            check=True,
            capture_output=True,
        )
        data = bundle / "rootfs" / "data"
        data.mkdir()
        with (data / "blob").open("wb") as blob:
            for _ in range(size_mib):
                blob.write(os.urandom(1024 * 1024))
        subprocess.run(
            ["umoci", "repack", "--image", f"{layout}:big", str(bundle)],
            check=True,
            capture_output=True,
        )


def _registry(cp: Controlplane) -> str:
    """The address of the controlplane's registry (the mirror of WORKER_IMAGE_HOST)."""
    for pair in cp.settings.registry_mirrors.split(","):
        host, _, address = pair.partition("=")
        if host == WORKER_IMAGE_HOST:
            return address
    raise RuntimeError(f"no mirror of {WORKER_IMAGE_HOST} in {cp.settings.registry_mirrors!r}")


async def _submit_to_running(
    cp: Controlplane, client: Client, image: str, gpus: int
) -> tuple[float, TaskRecord]:
    task = TaskInput(
        task_id=uuid.uuid4().hex[:12], pool_name=POOL, command=("true",), gpus=gpus, image=image
    )
    began = time.perf_counter()
    await start_task(client, cp.settings.task_queue, task)
    running = None
    while running is None:
        record = await task_record(client, task.task_id)
        if record is not None and record.state in ("running", "succeeded"):
            running = time.perf_counter() - began
        elif record is not None and record.state in ("failed", "cancelled", "lost"):
            raise RuntimeError(f"task {task.task_id} {record.state}: {record.reason}")
        else:
            await asyncio.sleep(0.1)

    async def ended() -> bool:
        done = await task_record(client, task.task_id)
        return done is not None and done.state == "succeeded"

    await eventually(ended, within=600)
    record = await task_record(client, task.task_id)
    assert record is not None
    return running, record


def _pulled(record: TaskRecord) -> str:
    return next((p.detail for p in record.phases if p.name == "image.pull"), "")


async def measure(
    env: WorkflowEnvironment, root: Path, layout: Path, cache: bool
) -> dict[str, object]:
    directory = root / ("on" if cache else "off")
    directory.mkdir()
    async with reconciling(
        env.client, directory, containers=True, pool_settings={"cache": {"enabled": cache}}
    ) as cp:
        await eventually(lambda: workers_available(cp), within=120)
        await asyncio.to_thread(push_layout, layout, f"{_registry(cp)}/{REPOSITORY}:big", "big")
        image = f"{WORKER_IMAGE_HOST}/{REPOSITORY}:big"
        client = await connect(cp.settings)
        first_s, first = await _submit_to_running(cp, client, image, gpus=2)
        if cache:  # the next heartbeat (every 10 s) reports the image; then it can prefer it

            async def reported() -> bool:
                handle = client.get_workflow_handle(pool_workflow_id(POOL))
                state = await handle.query("state", result_type=PoolState)
                return any(slot.images for slot in state.slots.values())

            await eventually(reported, within=60)
        else:
            await asyncio.sleep(12)  # as long as the cache-on run waits for the report
        second_s, second = await _submit_to_running(cp, client, image, gpus=1)
        return {
            "cache": cache,
            "first": {
                "node": first.node_name,
                "submit_to_running_s": round(first_s, 2),
                "image_pull": _pulled(first),
            },
            "second": {
                "node": second.node_name,
                "same_machine": second.node_name == first.node_name,
                "submit_to_running_s": round(second_s, 2),
                "image_pull": _pulled(second),
            },
        }


async def run(size_mib: int, root: Path) -> dict[str, object]:
    layout = root / "layout"
    began = time.perf_counter()
    await asyncio.to_thread(build_image, layout, size_mib)
    built_s = time.perf_counter() - began
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
        dev_server_startup_timeout=timedelta(seconds=60),
    )
    async with env:
        await ensure_search_attributes(env.client, "default")
        runs = [await measure(env, root, layout, cache) for cache in (True, False)]
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "image_mib": size_mib,
        "image_build_s": round(built_s, 1),
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", type=Path, help="kept; else a temporary directory, removed")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="l9-cache-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(json.dumps(asyncio.run(run(args.size_mib, root)), indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
