"""The spec's "what you see along the way" table, from this run's own logs (pure).

Each row is a line the spec quotes, found in a log, with its time since the demo started.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Row:
    where: str
    line: str
    at: datetime | None


def line_time(line: str) -> datetime | None:
    """The timestamp that starts every levers9 log line (`2026-09-18T10:00:00.123Z INFO ...`)."""
    stamp = line.split(" ", 1)[0]
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def first(where: str, lines: Iterable[str], needle: str, after: datetime | None = None) -> Row:
    """The first line containing `needle` (its message part, as the spec quotes it); with
    `after`, the first one logged since then (a log file keeps earlier runs' lines)."""
    for line in lines:
        if needle in line:
            at = line_time(line)
            if after is not None and at is not None and at < after:
                continue
            message = line[line.index(needle) :].strip()
            return Row(where=where, line=message, at=at)
    return Row(where=where, line=f"(not seen) {needle}", at=None)


def since(row: Row, start: datetime) -> str:
    if row.at is None:
        return "-"
    seconds = (row.at - start).total_seconds()
    return "before this run" if seconds < 0 else f"+{seconds:.1f} s"
