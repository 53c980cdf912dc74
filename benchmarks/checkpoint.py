"""Checkpoint and restore of a runsc task (root, the real runsc): a busybox task holding N MiB of
random data in its /tmp (gVisor's own tmpfs: the sandbox's memory, not the node's disk) is
checkpointed through the agent's own path (RuncContainer.checkpoint: runsc checkpoint, the
writable layer copied, the manifest's sha256 of every file, fsync, rename), then restored as a new
task (checksums verified, runsc restore) until it answers an exec; the restored task's data is
checked against its sha256 taken before. Prints, per size: checkpoint seconds (the call),
restore seconds (start to its first exec answered: `cat` of the sum taken before the
checkpoint; the data's own sha256 is checked after, untimed), the image's bytes, and the
sandbox's memory before the checkpoint (`runsc events --stats`). Not part of `make test`.

    sudo .venv/bin/python -m benchmarks.checkpoint --sizes 100,1024 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from levers9.agent import checkpoints
from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.runtime import ContainerSpec
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox

HOLD = (
    "dd if=/dev/urandom of=/tmp/blob bs=1048576 count={mib} 2>/dev/null;"
    " sha256sum /tmp/blob > /tmp/sum; echo held; sleep 100000"
)


def _spec(root: Path, image: str, command: str) -> ContainerSpec:
    name = f"b-{uuid.uuid4().hex[:8]}"
    task = root / "tasks" / name
    return ContainerSpec(
        task_id=name,
        image=image,
        command=("sh", "-c", command),
        env={},
        gpu_indices=(),
        result_path=task / "result.json",
        work_dir=task / "work",
    )


async def _exec(runtime: RunscRuntime, container: RuncContainer, *command: str) -> str:
    process = await runtime.exec(container, command)
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return out.decode().strip()


async def one(runtime: RunscRuntime, image: str, root: Path, mib: int) -> dict[str, float]:
    out = bytearray()
    container = await runtime.start(_spec(root, image, HOLD.format(mib=mib)), out.extend)
    assert isinstance(container, RuncContainer)
    while b"held" not in out:  # noqa: ASYNC110 - the task's output, relayed as it comes
        await asyncio.sleep(0.1)
    want = await _exec(runtime, container, "cat", "/tmp/sum")
    stats = await runtime._sandbox_stats(container.id)
    path = root / "checkpoints" / "bench" / f"c-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    size = await container.checkpoint(path, {})
    checkpointed = time.monotonic() - started
    restored_spec = dataclasses.replace(_spec(root, image, HOLD.format(mib=mib)), restore_from=path)
    started = time.monotonic()
    restored = await runtime.start(restored_spec, lambda _: None)
    assert isinstance(restored, RuncContainer)
    try:
        answered = ""
        for _ in range(600):  # the first exec may come before the sandbox has restored
            answered = await _exec(runtime, restored, "cat", "/tmp/sum")
            if answered:
                break
            await asyncio.sleep(0.05)
        restore_s = time.monotonic() - started
        # The data is checked after the clock stops: hashing 1 GiB inside gVisor (ptrace) is
        # the check's cost, not the restore's (it took several seconds of the first figures).
        got = await _exec(runtime, restored, "sh", "-c", "sha256sum /tmp/blob")
        if answered != want or got != want:
            raise SystemExit(f"restored data differs: {got!r} != {want!r}")
    finally:
        await restored.stop(1)
    await asyncio.to_thread(checkpoints.discard, path)
    return {"checkpoint_s": checkpointed, "restore_s": restore_s, "bytes": size, "memory": stats}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,1024", help="MiB held, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"nproc={os.cpu_count()} {platform.processor() or platform.machine()}")
    with tempfile.TemporaryDirectory(prefix="l9-ckpt-", dir="/var/tmp") as folder:
        root = Path(folder)
        with LocalRegistry(root / "registry") as registry:
            build_busybox(root / "layout", "bb", marker="bench")
            reference = f"{registry.address}/tasks/busybox:bb"
            push_layout(root / "layout", reference, "bb")
            runtime = RunscRuntime(
                ImageCache(root / "images", insecure=[registry.address]),
                root / "work" / "runsc",
                dev_root=root / "dev",
                driver_root=root / "nvidia",
                limits=Limits(memory_bytes=4 * 1024**3, pids=256),
            )
            for mib in (int(s) for s in args.sizes.split(",")):
                runs = [await one(runtime, reference, root, mib) for _ in range(args.runs)]
                row = {
                    "mib": mib,
                    "runs": len(runs),
                    "checkpoint_s_median": statistics.median(r["checkpoint_s"] for r in runs),
                    "restore_s_median": statistics.median(r["restore_s"] for r in runs),
                    "checkpoint_s_max": max(r["checkpoint_s"] for r in runs),
                    "restore_s_max": max(r["restore_s"] for r in runs),
                    "image_bytes": statistics.median(r["bytes"] for r in runs),
                    "sandbox_memory_bytes": statistics.median(r["memory"] for r in runs),
                }
                print(json.dumps(row))


if __name__ == "__main__":
    asyncio.run(main())
