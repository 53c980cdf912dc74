"""How fast the official client lists 100,000 pods over 5,000 nodes from the API emulator.

Loads the objects straight into the emulator's store (no HTTP), then lists every pod across
namespaces in pages of 500 with the official Python client, twice: as the client's model
objects (what the product does) and as raw JSON (the client's transport only, which shows how
much of the time is the client's own deserialization). The emulator runs on its own thread;
its CPU seconds are that thread's, measured there.

    python benchmarks/list_pods.py [--nodes 5000] [--pods 100000] [--page 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from sandbox.store import Store
from sandbox.synthetic import cpu_model, load
from sandbox.threaded import SandboxThread


def list_all(core: Any, page_size: int, raw: bool) -> tuple[int, int]:
    """Lists every pod in pages; returns (pages, pods)."""
    token: str | None = None
    pages = count = 0
    while True:
        if raw:
            response = core.list_pod_for_all_namespaces(
                limit=page_size, _continue=token, _preload_content=False
            )
            body = json.loads(response.data)
            count += len(body["items"])
            token = body["metadata"].get("continue")
        else:
            page = core.list_pod_for_all_namespaces(limit=page_size, _continue=token)
            count += len(page.items)
            token = page.metadata._continue
        pages += 1
        if not token:
            return pages, count


def measure(thread: SandboxThread, run: Callable[[], tuple[int, int]]) -> dict[str, float]:
    cpu_before = thread.call(time.thread_time)
    started = time.perf_counter()
    pages, pods = run()
    seconds = time.perf_counter() - started
    cpu = thread.call(time.thread_time) - cpu_before
    return {
        "seconds": seconds,
        "pages": pages,
        "pods": pods,
        "pods_per_s": pods / seconds,
        "emulator_cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=500)
    args = parser.parse_args()

    with SandboxThread() as thread, tempfile.TemporaryDirectory() as tmp:
        sandbox = thread.sandbox
        started = time.perf_counter()
        thread.run(_load_async(sandbox.store, args.nodes, args.pods), timeout=None)
        load_seconds = time.perf_counter() - started
        ca = Path(tmp, "ca.crt")
        ca.write_bytes(sandbox.ca.ca_pem)
        config = client.Configuration()
        config.host = sandbox.url
        config.ssl_ca_cert = str(ca)
        config.api_key = {"authorization": f"Bearer {sandbox.admin_token}"}
        core = client.CoreV1Api(client.ApiClient(config))
        rows = [
            ("official client, models", measure(thread, lambda: list_all(core, args.page, False))),
            ("official client, raw JSON", measure(thread, lambda: list_all(core, args.page, True))),
        ]

    print(
        f"loaded {args.nodes:,} nodes and {args.pods:,} pods into the store in {load_seconds:.1f} s"
    )
    print(
        f"machine: nproc={len(os.sched_getaffinity(0))}, cpu={cpu_model()}, "
        f"python {platform.python_version()}"
    )
    print()
    header = (
        f"{'list all pods, pages of ' + str(args.page):<30} {'seconds':>8} {'pages':>6} "
        f"{'pods':>8} {'pods/s':>9} {'emulator CPU s':>15}"
    )
    print(header)
    print("-" * len(header))
    for label, r in rows:
        print(
            f"{label:<30} {r['seconds']:>8.2f} {r['pages']:>6.0f} {r['pods']:>8,.0f} "
            f"{r['pods_per_s']:>9,.0f} {r['emulator_cpu_s']:>15.2f}"
        )


async def _load_async(store: Store, nodes: int, pods: int) -> None:
    load(store, nodes, pods)


if __name__ == "__main__":
    main()
