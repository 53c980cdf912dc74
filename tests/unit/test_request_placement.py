"""`request_placement` under a burst: it reads the pool's machine records once per burst, and
afresh before it refuses a task, for its cards or its memory limit (never refused on a stale
answer; records that keep no memory refuse none), and the requests of the
burst reach the pool in a few signals, each request in exactly one."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from activities import dispatch
from activities.dispatch import REQUEST_BATCH_MAX, Largest, RequestBatches, TaskActivities
from levers9.config import ControlplaneSettings
from levers9.models import PlaceRequest

GI = 2**30


def _asking(pool_name: str, gpus: int, memory_bytes: int = 0) -> PlaceRequest:
    return PlaceRequest(pool_name=pool_name, task_id="t1", gpus=gpus, memory_bytes=memory_bytes)


async def test_the_largest_machine_is_read_once_a_burst_and_afresh_before_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[str] = []

    async def records(client: Any, task_queue: str, pool_name: str) -> list[SimpleNamespace]:
        reads.append(pool_name)
        return [
            SimpleNamespace(total_gpus=4, total_memory_bytes=GI * 172),
            SimpleNamespace(total_gpus=2, total_memory_bytes=GI * 64),
        ]

    monkeypatch.setattr(dispatch, "machine_records", records)
    settings = ControlplaneSettings.model_validate({"taskQueue": "q"})
    activities = TaskActivities(client=None, settings=settings)  # type: ignore[arg-type]
    largest = Largest(gpus=4, memory_bytes=GI * 172)
    assert [await activities._largest_machine(_asking("p", 2)) for _ in range(50)] == [largest] * 50
    assert reads == ["p"], "one read for the burst"
    assert await activities._largest_machine(_asking("p", 8)) == largest
    assert reads == ["p", "p"], "a refusal reads the records afresh"
    assert await activities._largest_machine(_asking("p", 1, GI * 1024)) == largest
    assert reads == ["p", "p", "p"], "a refusal for memory too"
    assert await activities._largest_machine(_asking("p", 1, GI * 100)) == largest
    assert reads == ["p", "p", "p"], "what fits is answered from the read"
    assert await activities._largest_machine(_asking("other", 1)) == largest
    assert reads == ["p", "p", "p", "other"], "each pool its own"
    monkeypatch.setattr(dispatch, "LARGEST_TTL_S", 0.0)
    await activities._largest_machine(_asking("p", 1))
    assert reads[-1] == "p", "past the TTL, read again"
    assert len(reads) == 5


async def test_records_that_keep_no_memory_refuse_no_memory_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Machine records made before they kept the node's memory (0) say nothing of it."""

    async def records(client: Any, task_queue: str, pool_name: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(total_gpus=4, total_memory_bytes=0)]

    monkeypatch.setattr(dispatch, "machine_records", records)
    settings = ControlplaneSettings.model_validate({"taskQueue": "q"})
    activities = TaskActivities(client=None, settings=settings)  # type: ignore[arg-type]
    largest = await activities._largest_machine(_asking("p", 1, GI * 1024))
    assert largest == Largest(gpus=4, memory_bytes=None)
    assert largest.holds(_asking("p", 1, GI * 1024))


async def test_a_burst_of_requests_is_a_few_signals_and_each_request_is_in_one() -> None:
    sent: list[tuple[str, list[str]]] = []

    async def send(pool_name: str, requests: list[PlaceRequest]) -> None:
        await asyncio.sleep(0.01)
        sent.append((pool_name, [r.task_id for r in requests]))

    batches = RequestBatches(send)
    burst = [
        PlaceRequest(pool_name=f"pool-{n % 2}", task_id=f"t{n:04d}", gpus=1) for n in range(1_200)
    ]
    await asyncio.gather(*(batches.add(r) for r in burst))
    assert len(sent) <= 6, f"{len(sent)} signals for 1,200 requests"
    assert all(len(ids) <= REQUEST_BATCH_MAX for _, ids in sent)
    told = sorted(task_id for _, ids in sent for task_id in ids)
    assert told == sorted(r.task_id for r in burst), "each request in exactly one signal"
    assert all(all(int(t[1:]) % 2 == int(pool[-1]) for t in ids) for pool, ids in sent)


async def test_a_failed_signal_fails_the_requests_of_its_batch() -> None:
    async def send(pool_name: str, requests: list[PlaceRequest]) -> None:
        raise RuntimeError("Temporal unavailable")

    batches = RequestBatches(send)
    results = await asyncio.gather(
        *(batches.add(PlaceRequest(pool_name="p", task_id=f"t{n}", gpus=1)) for n in range(3)),
        return_exceptions=True,
    )
    assert [str(r) for r in results] == ["Temporal unavailable"] * 3
