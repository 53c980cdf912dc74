"""The pool's `taskDefaults` end to end on the sandbox: a task that names no image runs under
runc in the pool's default image (the Python image, pulled through the pool's registry mirror),
`levers9 run` says so and the record names it; the GPU check (`levers9 pool check`) runs in it
and reports `"host": "runc"`; the pool's default memory limit holds a task that names none, and
`--memory` overrides it. Root only (runc), as CI and the worker Job are.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from sandbox import registries, task_images
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]

WITHIN = 60
GAR_HOST = "us-central1-docker.pkg.dev"
DEFAULT_IMAGE = f"{GAR_HOST}/demo/tasks/python:3.11"
ALLOCATE = "x = bytearray({n} * 1024 * 1024); print('held', len(x) >> 20, 'MiB')"


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("defaults")
    layout, tag = await asyncio.to_thread(task_images.python_image)
    with registries.LocalRegistry(directory / "gar") as gar:
        await asyncio.to_thread(
            registries.push_layout, layout, f"{gar.address}/demo/tasks/python:{tag}", tag
        )
        settings: dict[str, Any] = {
            "registryMirrors": f"{GAR_HOST}={gar.address}",
            "insecureRegistries": gar.address,
        }
        defaults = {"taskDefaults": {"image": DEFAULT_IMAGE, "memory": "96Mi", "cpus": "1"}}
        async with reconciling(
            dev_env.client, directory, None, False, pool_settings=defaults, **settings
        ) as plane:
            await eventually(lambda: workers_available(plane), within=WITHIN)
            yield plane


async def test_a_task_without_an_image_runs_in_the_pools_default(cp: Controlplane) -> None:
    script = "import os, sys; print(sys.version_info[:2], os.getpid())"
    done = await cp.cli("run", "--pool", POOL, "--", "python3", "-c", script)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(
        "image the pool's default (taskDefaults.image, else the worker's own)"
    ), lines[0]
    assert "(3, 11) 1" in lines, "Debian's Python 3.11, as PID 1 of its own namespace"
    [shown] = [line for line in lines if line.startswith("image=")]
    assert shown.startswith(f"image={DEFAULT_IMAGE} digest=sha256:")
    assert shown.endswith(" host=runc")
    task_id = lines[0].split()[1]
    record = json.loads((await cp.cli("task", "get", task_id, "-o", "json")).stdout)
    assert (record["image"], record["host"]) == (DEFAULT_IMAGE, "runc")


async def test_the_gpu_check_runs_in_runc(cp: Controlplane) -> None:
    done = await cp.cli("pool", "check", "--pool", POOL, "--gpu", "RTXPro6000")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout[done.stdout.index("COMPLETE {") + len("COMPLETE ") :])
    assert report == {
        "host": "runc",
        "nvidia_smi": None,
        "cuda": False,
        "device": None,
        "matmul_ok": None,
    }, "what the container saw: no driver on this machine, and no invented device"


async def test_the_pools_default_memory_limit_and_the_override(cp: Controlplane) -> None:
    over = await cp.cli("run", "--pool", POOL, "--", "python3", "-c", ALLOCATE.format(n=400))
    assert over.returncode == 1, over.stdout + over.stderr
    assert " failed exit_code=137 " in over.stdout
    assert "reason: OOMKilled" in over.stdout
    allowed = ("run", "--pool", POOL, "--memory", "1Gi")
    done = await cp.cli(*allowed, "--", "python3", "-c", ALLOCATE.format(n=400))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held 400 MiB" in done.stdout
