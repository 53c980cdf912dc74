"""A box's names, durations and idle deadline (levers9.core.boxes, levers9.box_state)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from levers9.box_state import BoxState
from levers9.core.boxes import (
    box_name_problem,
    box_of_task_id,
    box_task_id,
    idle_stop_problem,
    parse_duration,
)
from levers9.core.storage import parse_mount
from levers9.models import TaskInput


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("45", 45)]
)
def test_durations_read_as_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "2x", "-5m", "1.5h", "2 h"])
def test_a_duration_that_is_none_is_refused_naming_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration: give e\.g\. 90s, 30m, 2h or 1d"):
        parse_duration(text)


def test_idle_stop_is_never_or_a_minute_to_thirty_days() -> None:
    assert idle_stop_problem(0) is None
    assert idle_stop_problem(60) is None
    assert idle_stop_problem(30 * 86400) is None
    assert idle_stop_problem(59) == "59 s is not between 60 s and 30 days (0: never)"
    assert idle_stop_problem(30 * 86400 + 1) is not None


def test_a_box_is_named_by_a_short_dns_label() -> None:
    assert box_name_problem("dev-1") is None
    assert box_name_problem("Dev") is not None
    problem = box_name_problem("a" * 41)
    assert problem is not None
    assert "at most 40 characters" in problem
    assert box_task_id("dev", 3, "ab12") == "dev-3-ab12"


def _box(idle: int, **update: object) -> BoxState:
    task = TaskInput(
        task_id="-",
        pool_name="p",
        command=("true",),
        mounts=(parse_mount("disk", "scratch:/home"),),
    )
    made = datetime(2026, 1, 1, tzinfo=UTC)
    return BoxState(name="dev", workspace="w", task=task, idle_stop_seconds=idle, created_at=made)


def test_the_idle_deadline_runs_from_the_last_use_and_only_while_running() -> None:
    box = _box(600)
    assert box.idle_deadline() == box.created_at + timedelta(seconds=600)
    box.last_used_at = box.created_at + timedelta(hours=1)
    assert box.idle_deadline() == box.last_used_at + timedelta(seconds=600)
    box.state = "stopped"
    assert box.idle_deadline() is None
    assert _box(0).idle_deadline() is None
    assert box.home() == "disk scratch at /home"


def test_a_box_keeps_its_last_twenty_events() -> None:
    box = _box(0)
    for n in range(25):
        box.note(box.created_at, "use", str(n))
    assert [e.message for e in box.events] == [str(n) for n in range(5, 25)]


def test_a_box_task_id_reads_back_as_its_box_and_no_other_id_does() -> None:
    assert box_of_task_id(box_task_id("web", 2, "c963b2b7")) == "web"
    assert box_of_task_id(box_task_id("my-box", 12, "ab")) == "my-box"
    for task_id in ("6be3e6d69bbf", "a-b", "x-y-z", "-1-ab", "web-1-"):
        assert box_of_task_id(task_id) == "", task_id
