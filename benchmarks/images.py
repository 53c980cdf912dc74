"""Container start on a worker: cold (image not cached) against warm (cached), p50 and p95 of
`RuncRuntime.start` (pull if needed, overlay, runc until the container runs), with the real
runc, umoci and skopeo and a local registry; and what a second task of one image started at the
same moment costs (the copies it makes: none). Root only (runc).

    sudo python benchmarks/images.py [--image python|busybox] [--runs 20]

The image is the Python task image (sandbox/task_images.py: Debian's Python 3.11 from
mmdebstrap, 47 MB compressed; built once per machine) or the tests' busybox (1 MB). A cold
start's target is the pull's own time + 1 s, a warm one's 0.3 s (issue 16).
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

from levers9.agent.images import ImageCache
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import ContainerSpec
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox, python_image


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


def _remove(path: Path) -> None:
    """A cold cache's unpacked image goes once measured (the Python one is 150 MB a run)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _layout(root: Path, name: str) -> tuple[Path, str, str]:
    """(layout, tag, what it is)."""
    if name == "python":
        layout, tag = python_image(print)
        size = sum(p.stat().st_size for p in (layout / "blobs").rglob("*") if p.is_file())
        return layout, tag, f"the Python image ({size / 1e6:.0f} MB)"
    build_busybox(root / "layout", "bb")
    return root / "layout", "bb", "busybox (1 MB)"


async def main(runs: int, name: str) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("LEVERS9_BENCH_DIR")) as scratch:
        root = Path(scratch)
        with LocalRegistry(root / "registry") as registry:
            layout, tag, what = _layout(root, name)
            image = f"{registry.address}/bench/{name}:{tag}"
            push_layout(layout, image, tag)
            cold, pulls, warm = [], [], []
            for n in range(runs):
                cache = ImageCache(root / f"cold-{n}", insecure=[registry.address])
                began = time.perf_counter()
                await cache.pull(image)
                pulls.append(time.perf_counter() - began)
                fresh = ImageCache(root / f"cold2-{n}", insecure=[registry.address])
                runtime = RuncRuntime(fresh, root / "runc", cards=())
                cold.append(await _start(runtime, _spec(root, n, image)))
                for used in (cache, fresh):
                    await asyncio.to_thread(_remove, used.root)
            cache = ImageCache(root / "warm", insecure=[registry.address])
            runtime = RuncRuntime(cache, root / "runc", cards=())
            await _start(runtime, _spec(root, 10_000, image))
            for n in range(runs):
                warm.append(await _start(runtime, _spec(root, 20_000 + n, image)))

            shared = ImageCache(root / "shared", insecure=[registry.address])
            runtime = RuncRuntime(shared, root / "runc", cards=())
            alone, together = await asyncio.gather(
                _start(runtime, _spec(root, 30_000, image)),
                _start(runtime, _spec(root, 30_001, image)),
            )
    print(f"nproc={os.cpu_count()} {platform.machine()}, {runs} runs, {what}")
    print("| start | p50 s | p95 s |")
    print("| - | - | - |")
    for name, values in (
        ("the pull alone (skopeo copy + umoci unpack)", pulls),
        ("cold (not cached)", cold),
        ("warm (cached)", warm),
    ):
        print(f"| {name} | {_p(values, 0.5):.3f} | {_p(values, 0.95):.3f} |")
    print(
        f"two tasks of one image at once on a cold cache: {shared.copies} copy, starts"
        f" {alone:.3f} s and"
        f" {together:.3f} s; cold minus pull, median: "
        f"{statistics.median(cold) - statistics.median(pulls):.3f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--image", choices=("python", "busybox"), default="python")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.image))
