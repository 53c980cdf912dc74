"""`request_placement` reads the pool's machine records once per burst of requests, and afresh
before it refuses a task: a burst of 10,000 tasks makes a handful of visibility lists, and a
task is never refused on a stale answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from activities import dispatch
from activities.dispatch import TaskActivities
from levers9.config import ControlplaneSettings


async def test_the_largest_machine_is_read_once_a_burst_and_afresh_before_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[str] = []

    async def records(client: Any, task_queue: str, pool_name: str) -> list[SimpleNamespace]:
        reads.append(pool_name)
        return [SimpleNamespace(total_gpus=4), SimpleNamespace(total_gpus=2)]

    monkeypatch.setattr(dispatch, "machine_records", records)
    settings = ControlplaneSettings.model_validate({"taskQueue": "q"})
    activities = TaskActivities(client=None, settings=settings)  # type: ignore[arg-type]
    assert [await activities._largest_machine("p", 2) for _ in range(50)] == [4] * 50
    assert reads == ["p"], "one read for the burst"
    assert await activities._largest_machine("p", 8) == 4
    assert reads == ["p", "p"], "a refusal reads the records afresh"
    assert await activities._largest_machine("other", 1) == 4
    assert reads == ["p", "p", "other"], "each pool its own"
    monkeypatch.setattr(dispatch, "LARGEST_TTL_S", 0.0)
    await activities._largest_machine("p", 1)
    assert reads[-1] == "p", "past the TTL, read again"
    assert len(reads) == 4
