"""A published port of a runsc task, reached through the relay inside its sandbox, against the
same port of a runc task reached in its network namespace (root, the real runc and runsc).

Both tasks run busybox httpd on their port (the same image). Through the agent's own openers
(levers9.agent.task_ports: a runsc container's `dialer`, `runsc exec` of the relay per
connection; a runc container's `netns`, `task_network.open_connection`), N requests, each on a
new connection (connect, `GET /`, the whole answer, close). Prints p50, p95 and the whole run
per path, and their ratio. Then a checkpoint of the runsc task taken at once after a request
(the case the relay exists for): its time and size (it raises if it fails). Not part of
`make test`.

    sudo .venv/bin/python -m benchmarks.sandbox_ports --requests 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from levers9.agent import task_network
from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.runtime import ContainerSpec, Streams
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox

PORT = 8080
SERVE = (
    "mkdir -p /dev/shm/www && echo served > /dev/shm/www/index.html"
    f" && exec busybox httpd -f -p 127.0.0.1:{PORT} -h /dev/shm/www"
)


def _spec(root: Path, image: str) -> ContainerSpec:
    name = f"p-{uuid.uuid4().hex[:8]}"
    task = root / "tasks" / name
    return ContainerSpec(
        task_id=name,
        image=image,
        command=("sh", "-c", SERVE),
        env={},
        gpu_indices=(),
        result_path=task / "result.json",
        work_dir=task / "work",
        ports=(PORT,),
    )


def _opener(container: RuncContainer) -> Callable[[int], Awaitable[Streams]]:
    if container.dialer is not None:
        return container.dialer
    netns = container.netns
    assert netns is not None
    return lambda port: task_network.open_connection(netns, port)


async def _get(opener: Callable[[int], Awaitable[Streams]]) -> bytes:
    reader, writer = await opener(PORT)
    try:
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def _ready(opener: Callable[[int], Awaitable[Streams]]) -> None:
    for _ in range(300):
        try:
            if b"served" in await _get(opener):
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the task's port never answered")


async def _requests(opener: Callable[[int], Awaitable[Streams]], n: int) -> dict[str, float]:
    times = []
    started = time.monotonic()
    for _ in range(n):
        one = time.monotonic()
        answer = await _get(opener)
        times.append(time.monotonic() - one)
        if b"served" not in answer:
            raise SystemExit(f"unexpected answer: {answer!r}")
    whole = time.monotonic() - started
    times.sort()
    return {
        "p50_ms": round(statistics.median(times) * 1000, 2),
        "p95_ms": round(times[int(len(times) * 0.95) - 1] * 1000, 2),
        "all_s": round(whole, 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    print(f"nproc={os.cpu_count()} {platform.processor() or platform.machine()}")
    with tempfile.TemporaryDirectory(prefix="l9-ports-", dir="/var/tmp") as folder:
        root = Path(folder)
        with LocalRegistry(root / "registry") as registry:
            build_busybox(root / "layout", "bb", marker="bench")
            reference = f"{registry.address}/tasks/busybox:bb"
            push_layout(root / "layout", reference, "bb")
            images = ImageCache(root / "images", insecure=[registry.address])
            options = {
                "dev_root": root / "dev",
                "driver_root": root / "nvidia",
                "limits": Limits(memory_bytes=512 * 1024**2, pids=256),
            }
            rows = {}
            for cls in (RuncRuntime, RunscRuntime):
                runtime = cls(images, root / "work" / cls.host, **options)  # type: ignore[arg-type]
                out = bytearray()
                container = await runtime.start(_spec(root, reference), out.extend)
                assert isinstance(container, RuncContainer)
                try:
                    opener = _opener(container)
                    try:
                        await _ready(opener)
                    except SystemExit:
                        raise SystemExit(
                            f"{cls.host}: its port never answered: {bytes(out)!r}"
                        ) from None
                    rows[cls.host] = await _requests(opener, args.requests)
                    if cls is RunscRuntime:
                        path = root / "checkpoints" / "bench" / "after-request"
                        await _get(opener)
                        started = time.monotonic()
                        size = await container.checkpoint(path, {})
                        rows[cls.host]["checkpoint_after_request_s"] = round(
                            time.monotonic() - started, 3
                        )
                        rows[cls.host]["checkpoint_bytes"] = size
                finally:
                    # Its end (ended by the checkpoint, or stopped now) unmounts what it held.
                    await container.stop(1)
            for host, row in rows.items():
                print(json.dumps({"runtime": host, "requests": args.requests, **row}))
            ratio = rows["runsc"]["p50_ms"] / rows["runc"]["p50_ms"]
            print(json.dumps({"new_connection_p50_ratio_runsc_over_runc": round(ratio, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
