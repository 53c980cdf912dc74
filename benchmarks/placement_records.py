"""What benchmarks/placement.py reads from the task records after a run with workspaces (pure):
whether every workspace kept its quota at every instant, each workspace's share of GPU-seconds
while every workspace had work waiting against the share fair share entitles it to, the time
from submit to placed, and how long a card stayed idle between two tasks of its worker.

A record holds its task on [its `placement` phase, `finished_at`]: both are times of its own
workflow, the first when the pool's `placed` reached it, the second when its end did, so the
interval lies inside the one the pool held its cards for (placed before the first, released
after the second). A quota kept by the pool is therefore kept by the records; one the records
break, the pool broke.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from levers9.models import TaskRecord

PLACEMENT = "placement"


@dataclass(frozen=True)
class Held:
    """One task's hold of its cards, as its record shows it."""

    task_id: str
    workspace: str
    worker_id: str
    gpus: int
    created: datetime
    placed: datetime
    ended: datetime


def holds(records: Sequence[TaskRecord]) -> list[Held]:
    """The holds of the records that were placed and ended (ValueError naming a record that
    ended without either time)."""
    found = []
    for record in records:
        placed = next((p.at for p in record.phases if p.name == PLACEMENT and p.at), None)
        if placed is None or record.finished_at is None or record.worker_id is None:
            raise ValueError(f"task {record.task_id} ({record.state}) has no placement or end")
        found.append(
            Held(
                record.task_id,
                record.workspace,
                record.worker_id,
                record.gpus,
                record.created_at,
                placed,
                record.finished_at,
            )
        )
    return found


def most_held(held: Sequence[Held]) -> dict[str, int]:
    """By workspace: the most cards its tasks held at one instant (an end before a start at
    the same instant)."""
    events: dict[str, list[tuple[datetime, int, int]]] = defaultdict(list)
    for h in held:
        events[h.workspace] += [(h.placed, 1, h.gpus), (h.ended, 0, -h.gpus)]
    peaks = {}
    for workspace, steps in events.items():
        now = peak = 0
        for _, _, delta in sorted(steps):
            now += delta
            peak = max(peak, now)
        peaks[workspace] = peak
    return peaks


def entitled(quotas: Mapping[str, int | None], cards: int) -> dict[str, float]:
    """Each workspace's cards under fair share with weight 1 (what a record gives every
    workspace) and its quota: the same level for all, capped at a quota (water-filling)."""
    level, left, open_ = 0.0, float(cards), set(quotas)
    while open_:
        level = left / len(open_)
        capped = {w for w in open_ if (q := quotas[w]) is not None and q <= level}
        if not capped:
            break
        for w in capped:
            left -= quotas[w] or 0
        open_ -= capped
    return {w: float(q) if w not in open_ and q is not None else level for w, q in quotas.items()}


def contended(held: Sequence[Held], since: datetime) -> tuple[datetime, datetime]:
    """The window in which every workspace had work waiting: from `since` (the last submit) to
    the first moment a workspace's last task was placed."""
    last_placed: dict[str, datetime] = {}
    for h in held:
        last_placed[h.workspace] = max(last_placed.get(h.workspace, h.placed), h.placed)
    return since, min(last_placed.values())


def gpu_seconds(held: Sequence[Held], window: tuple[datetime, datetime]) -> dict[str, float]:
    """By workspace: the GPU-seconds its tasks held inside `window`."""
    begin, end = window
    totals: dict[str, float] = defaultdict(float)
    for h in held:
        overlap = (min(h.ended, end) - max(h.placed, begin)).total_seconds()
        if overlap > 0:
            totals[h.workspace] += overlap * h.gpus
    return dict(totals)


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def idle_gaps(held: Sequence[Held], until: datetime) -> list[float]:
    """Seconds between a task's end and the next placement on its worker, for placements up to
    `until` (the contended window's end: each worker has one card here, so how long a freed
    card stayed free while every workspace had tasks waiting)."""
    by_worker: dict[str, list[Held]] = defaultdict(list)
    for h in held:
        by_worker[h.worker_id].append(h)
    gaps = []
    for tasks in by_worker.values():
        tasks.sort(key=lambda h: h.placed)
        gaps += [
            (b.placed - a.ended).total_seconds()
            for a, b in itertools.pairwise(tasks)
            if b.placed <= until
        ]
    return gaps
