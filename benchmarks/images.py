"""Container start on a worker: cold (image not cached) against warm (cached), p50 and p95 of
`RuncRuntime.start` (pull if needed, overlay, runc until the container runs), with the real
runc, umoci and skopeo and a local registry; and what a second task of one image started at the
same moment costs (the copies it makes: none). Root only (runc).

    sudo python benchmarks/images.py [--runs 20]

The image is the tests' busybox (sandbox/task_images.py, 1 MB); a cold start's target is the
pull's own time + 1 s, a warm one's 0.3 s (issue 16).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from levers9.worker.images import ImageCache
from levers9.worker.runc_runtime import RuncRuntime
from levers9.worker.runtime import ContainerSpec
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox


def _spec(root: Path, n: int, image: str) -> ContainerSpec:
    task = root / "tasks" / f"b{n}"
    return ContainerSpec(
        task_id=f"bench-{os.getpid()}-{n}",
        image=image,
        command=("true",),
        env={},
        gpu_indices=(),
        result_path=task / "result" / "result.json",
        work_dir=task / "work",
    )


async def _start(runtime: RuncRuntime, spec: ContainerSpec) -> float:
    began = time.perf_counter()
    container = await runtime.start(spec, lambda _: None)
    started = time.perf_counter() - began
    await container.wait()
    return started


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        with LocalRegistry(root / "registry") as registry:
            build_busybox(root / "layout", "bb")
            image = f"{registry.address}/bench/busybox:bb"
            push_layout(root / "layout", image, "bb")
            cold, pulls, warm = [], [], []
            for n in range(runs):
                cache = ImageCache(root / f"cold-{n}", insecure=[registry.address])
                began = time.perf_counter()
                await cache.pull(image)
                pulls.append(time.perf_counter() - began)
                fresh = ImageCache(root / f"cold2-{n}", insecure=[registry.address])
                runtime = RuncRuntime(fresh, root / "runc", driver_root=root / "none")
                cold.append(await _start(runtime, _spec(root, n, image)))
            cache = ImageCache(root / "warm", insecure=[registry.address])
            runtime = RuncRuntime(cache, root / "runc", driver_root=root / "none")
            await _start(runtime, _spec(root, 10_000, image))
            for n in range(runs):
                warm.append(await _start(runtime, _spec(root, 20_000 + n, image)))

            shared = ImageCache(root / "shared", insecure=[registry.address])
            runtime = RuncRuntime(shared, root / "runc", driver_root=root / "none")
            alone, together = await asyncio.gather(
                _start(runtime, _spec(root, 30_000, image)),
                _start(runtime, _spec(root, 30_001, image)),
            )
    print(f"nproc={os.cpu_count()} {platform.machine()}, {runs} runs, busybox (1 MB)")
    print("| start | p50 s | p95 s |")
    print("| - | - | - |")
    for name, values in (
        ("the pull alone (skopeo copy + umoci unpack)", pulls),
        ("cold (not cached)", cold),
        ("warm (cached)", warm),
    ):
        print(f"| {name} | {_p(values, 0.5):.3f} | {_p(values, 0.95):.3f} |")
    print(
        f"two tasks of one image at once: {shared.copies} copy, starts {alone:.3f} s and"
        f" {together:.3f} s; cold minus pull, median: "
        f"{statistics.median(cold) - statistics.median(pulls):.3f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
