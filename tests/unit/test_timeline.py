"""The demo's timeline: the first log line with each spec message, and its time since the start."""

from __future__ import annotations

from datetime import UTC, datetime

from levers9.timeline import first, line_time, since

LINES = [
    "2026-09-18T10:00:01.000Z INFO  loaded controller gpu_type=RTXPro6000 pool_name=p",
    "2026-09-18T10:00:05.500Z INFO  using existing machine hostname=n1 machine_id=m1",
    "2026-09-18T10:00:06.000Z INFO  using existing machine hostname=n2 machine_id=m2",
]
START = datetime(2026, 9, 18, 10, 0, tzinfo=UTC)


def test_first_line_and_time() -> None:
    row = first("controlplane log", LINES, "using existing machine")
    assert row.line == "using existing machine hostname=n1 machine_id=m1"
    assert since(row, START) == "+5.5 s"


def test_missing_and_unparsable() -> None:
    row = first("worker log", LINES, "resolved NVIDIA_VISIBLE_DEVICES")
    assert (row.at, since(row, START)) == (None, "-")
    assert line_time("not a log line") is None
    assert (
        since(first("x", LINES, "loaded"), datetime(2026, 9, 19, tzinfo=UTC)) == "before this run"
    )


def test_first_skips_lines_from_before_this_run() -> None:
    from datetime import UTC, datetime

    from levers9.timeline import first

    lines = [
        "2026-11-30T16:00:00.000Z INFO worker available worker_id=old",
        "2026-11-30T17:00:00.000Z INFO worker available worker_id=new",
    ]
    start = datetime(2026, 11, 30, 16, 30, tzinfo=UTC)
    assert first("log", lines, "worker available", start).line == "worker available worker_id=new"
    assert first("log", lines, "worker available").line == "worker available worker_id=old"
