"""Workers end to end on the sandbox, as the spec's "Day two" and troubleshooting rows say:
`kubectl -n levers9 delete jobs --all` -> the records expire after the record TTL (seconds here)
-> the next reconcile starts fresh workers; a worker image missing from the registry -> the
pending record carries `ImagePullBackOff` with the fix, and once the image is there the worker
becomes available.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.models import WorkerRecord
from levers9.records.listing import list_worker_records
from tests.controlplane import POOL, Controlplane, reconciling
from tests.waiting import eventually

pytestmark = pytest.mark.integration

TTL_MINUTES = 0.3  # eighteen seconds: longer than a pending worker's pod check (10 s)
WITHIN = 60
PULL_CONDITIONS = ("ImagePullBackOff", "ErrImagePull")  # the kubelet alternates the two
WORKER_IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("workers")
    async with reconciling(dev_env.client, directory, workerRecordTtlMinutes=TTL_MINUTES) as plane:
        yield plane


async def _running(cp: Controlplane) -> list[WorkerRecord]:
    return await list_worker_records(cp.settings, POOL, include_ended=False)


async def _all_available(cp: Controlplane, count: int = 3) -> list[WorkerRecord]:
    async def ready() -> bool:
        records = await _running(cp)
        return len(records) == count and all(r.state == "available" for r in records)

    await eventually(ready, within=WITHIN)
    return await _running(cp)


async def test_deleted_jobs_expire_and_fresh_workers_follow(cp: Controlplane) -> None:
    before = {r.worker_id for r in await _all_available(cp)}
    await cp.kubectl("-n", "levers9", "delete", "jobs", "--all")
    fresh = await _all_available_excluding(cp, before)
    assert not {r.worker_id for r in fresh} & before
    ended = await list_worker_records(cp.settings, POOL, include_ended=True)
    states = {r.worker_id: r.state for r in ended if r.worker_id in before}
    assert set(states.values()) == {"expired"}, states


async def _all_available_excluding(cp: Controlplane, old: set[str]) -> list[WorkerRecord]:
    async def fresh() -> bool:
        records = [r for r in await _running(cp) if r.worker_id not in old]
        return len(records) == 3 and all(r.state == "available" for r in records)

    await eventually(fresh, within=WITHIN)
    return [r for r in await _running(cp) if r.worker_id not in old]


async def test_missing_image_shows_image_pull_backoff_with_the_fix(
    cp: Controlplane, log_lines: io.StringIO
) -> None:
    before = {r.worker_id for r in await _all_available(cp)}
    cp.sandbox.cluster.remove_image(WORKER_IMAGE)
    await cp.kubectl("-n", "levers9", "delete", "jobs", "--all")

    async def backing_off() -> bool:
        records = [r for r in await _running(cp) if r.worker_id not in before]
        return any(
            r.state == "pending" and (r.condition or "").startswith(PULL_CONDITIONS)
            for r in records
        )

    await eventually(backing_off, within=WITHIN)
    [record, *_] = [r for r in await _running(cp) if r.worker_id not in before and r.condition]
    assert record.condition is not None
    assert record.condition.split(": ", 1) in [
        [
            reason,
            "image not in the project's registry: rerun deploy/gke/attach-gke-pool.sh"
            " (it copies latest)",
        ]
        for reason in PULL_CONDITIONS
    ]
    pods = await cp.kubectl("-n", "levers9", "get", "pods")
    assert "ImagePullBackOff" in pods or "ErrImagePull" in pods
    # The controlplane's log says it too, with the fix (docs/troubleshooting.md).
    reason = record.condition.split(": ", 1)[0]
    assert (
        f" WARNING worker image cannot be pulled worker_id={record.worker_id}"
        f" pool_name={POOL} reason={reason} fix=\"image not in the project's registry: rerun"
        ' deploy/gke/attach-gke-pool.sh (it copies latest)"\n'
    ) in log_lines.getvalue()
    cp.sandbox.cluster.add_image(WORKER_IMAGE)  # rerun attach-gke-pool.sh: the image is copied
    await _all_available_excluding(cp, before)
