"""Fair share at scale, in the placement core alone (levers9.core.placement, PoolWorkflow's state):
W workspaces submit N one-card tasks in all to a pool of M machines of 1-8 cards, in a
discrete-event simulation of the pool's queue (no Temporal: what the pool decides, not what it
costs; benchmarks/placement.py measures that on the dev server).

    python benchmarks/fair_share.py [--workspaces 20] [--tasks 10000] [--machines 200]

Every workspace has a weight (1, 2 or 3) and no quota: fair share alone divides the cards (the
quotas are held by tests/unit/test_fair_share.py). Tasks last 30-300 s (seeded). Reports each
workspace's share of GPU-seconds while every workspace had work waiting, against its weight's
share (target, issue 37: within 5%), the CPU the placement took per placed task, and the
largest queue.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from levers9.core.placement import PoolState, Slot

T0 = datetime(2026, 12, 5, tzinfo=UTC)
RESERVE = timedelta(seconds=30)


def main(workspaces: int, tasks: int, machines: int, seed: int) -> None:
    rng = random.Random(seed)
    state = PoolState()
    cards = 0
    for m in range(machines):
        n = rng.choice((1, 2, 4, 8))
        cards += n
        state.add_worker(
            Slot(
                worker_id=f"w{m}", node_name=f"n{m}", address="127.0.0.1:1", devices=tuple(range(n))
            )
        )
    names = [f"ws{i:02d}" for i in range(workspaces)]
    weights = {ws: rng.choice((1, 2, 3)) for ws in names}
    total_weight = sum(weights.values())
    for ws in names:
        # No quota: fair share alone divides the cards.
        state.set_share(ws, quota=None, weight=weights[ws])
    per = tasks // workspaces
    backlog = {ws: [rng.uniform(30, 300) for _ in range(per)] for ws in names}
    now = 0.0
    ends: list[tuple[float, str]] = []
    duration: dict[str, float] = {}
    gpu_seconds: dict[str, float] = defaultdict(float)
    placed_count = 0
    cpu = 0.0
    deepest = 0
    contended_until = None
    for ws in names:  # everything submitted at once
        for i, seconds in enumerate(backlog[ws]):
            task_id = f"{ws}-{i}"
            duration[task_id] = seconds
            state.request(task_id, 1, T0 + timedelta(microseconds=i), workspace=ws)
    deepest = len(state.waiting)
    while True:
        started = time.process_time()
        made = state.assign(T0 + timedelta(seconds=now), RESERVE)
        cpu += time.process_time() - started
        held = state.held()
        for placement in made:
            placed_count += 1
            heapq.heappush(ends, (now + duration[placement.task_id], placement.task_id))
        contended = len({w.workspace for w in state.waiting}) == workspaces
        if not contended and contended_until is None:
            contended_until = now  # from here some workspace has nothing left waiting
        if not ends:
            break
        at, task_id = heapq.heappop(ends)
        if contended:
            for ws, n in held.items():
                gpu_seconds[ws] += n * (at - now)
        now = at
        started = time.process_time()
        state.release(task_id)
        cpu += time.process_time() - started
    total = sum(gpu_seconds.values())
    worst = 0.0
    print(f"{workspaces} workspaces, {placed_count} tasks, {machines} machines ({cards} cards)")
    per_task = cpu / placed_count * 1e3
    print(f"largest queue: {deepest}; placement CPU per placed task: {per_task:.3f} ms")
    print(
        f"contended (every workspace waiting) until t={contended_until or now:.0f} s of {now:.0f} s"
    )
    for ws in names:
        want = weights[ws] / total_weight
        got = gpu_seconds[ws] / total if total else 0.0
        worst = max(worst, abs(got - want) / want)
    print(f"GPU-seconds share vs weight share while contended: worst off by {worst:.1%}")
    print("target: within 5%: " + ("met" if worst <= 0.05 else "NOT met"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workspaces", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--machines", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    main(args.workspaces, args.tasks, args.machines, args.seed)
