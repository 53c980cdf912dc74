"""GPU quotas, fair share and borrowing, end to end: the operator makes two workspaces, `small`
(quota 1) and `large` (quota 3), on the sandbox's pool (5 free cards: 1 + 2 + 2 of the 4-card
node a model server shares), and each team submits with its own token through the CLI.

- Eight one-card tasks each, all at once: the records show, at every instant a task was placed,
  neither workspace holding past its quota, and each reaching it (the queue gives freed cards
  to the workspace below its share); a task over quota says `quota` in `task get`.
- `small` borrows every free card (`--borrow`), then `large` asks for two cards within its
  quota: the newest borrowed tasks are taken back (`preempted: reclaimed by workspace large`),
  `large`'s task runs on the cards they free, and the borrowed tasks not taken back finish.
  The same with `--retries 1`: the tasks taken back keep that attempt in their records
  (`preempted`), queue again, and finish, as `large`'s does.
- A workspace keeping its `--max-queued` waiting is refused at submit, nothing started.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.models import TERMINAL, TaskRecord, pool_workflow_id
from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
QUOTAS = {"small": 1, "large": 3}


@dataclass
class Teams:
    cp: Controlplane
    client: Client
    tokens: dict[str, str]


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def teams(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Teams]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("quotas"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        tokens = {}
        for team, quota in QUOTAS.items():
            _ok(await plane.cli("workspace", "create", team, "--gpu-quota", str(quota)))
            made = await plane.cli("workspace", "token", "create", team, "--name", "ci")
            tokens[team] = _ok(made).strip()
        yield Teams(plane, await connect(plane.settings), tokens)


async def _submit(
    teams: Teams, team: str, *command: str, gpus: int = 1, borrow: bool = False, retries: int = 0
) -> str:
    flags = (["--borrow"] if borrow else []) + (["--retries", str(retries)] if retries else [])
    done = await teams.cp.cli(
        "run", "--pool", POOL, "--gpus", str(gpus), "--detach", *flags, "--", *command,
        token=teams.tokens[team],
    )  # fmt: skip
    return _ok(done).strip()


async def _submit_once_admitted(teams: Teams, team: str, *command: str) -> str:
    """A one-card task of `team`, submitted again while the gateway still answers with the
    workspace's limits it read before a `workspace set` (each replica keeps a workspace's record
    for TOKEN_CACHE_TTL_S); a refused submit starts nothing."""
    run = ("run", "--pool", POOL, "--gpus", "1", "--detach", "--", *command)
    done: list[subprocess.CompletedProcess[str]] = []

    async def admitted() -> bool:
        done.append(await teams.cp.cli(*run, token=teams.tokens[team]))
        return done[-1].returncode == 0

    await eventually(admitted, within=WITHIN, what=f"a submit of {team} admitted")
    return done[-1].stdout.strip()


async def _records(teams: Teams, ids: list[str]) -> dict[str, TaskRecord]:
    found = {}
    for task_id in ids:
        record = await task_record(teams.client, task_id)
        assert record is not None, task_id
        found[task_id] = record
    return found


async def _ended(teams: Teams, ids: list[str]) -> dict[str, TaskRecord]:
    async def all_ended() -> bool:
        return all(r.state in TERMINAL for r in (await _records(teams, ids)).values())

    await eventually(all_ended, within=WITHIN * 2)
    return await _records(teams, ids)


def _placed_at(record: TaskRecord) -> datetime:
    [at] = [p.at for p in record.phases if p.name == "placement" and p.at is not None]
    return at


def _held_at(records: list[TaskRecord], at: datetime) -> dict[str, int]:
    """Cards each workspace's tasks held at `at`, by their records (from placement to end: the
    pool frees them only after the record ends, so this never counts more than it held)."""
    held: dict[str, int] = {}
    for record in records:
        if record.finished_at is None or not record.phases:
            continue
        if _placed_at(record) <= at < record.finished_at:
            held[record.workspace] = held.get(record.workspace, 0) + record.gpus
    return held


async def test_quotas_hold_at_every_step_and_each_workspace_reaches_its_own(teams: Teams) -> None:
    ids: dict[str, list[str]] = {team: [] for team in QUOTAS}

    async def submit_eight(team: str) -> None:
        for _ in range(8):
            ids[team].append(await _submit(teams, team, "sleep", "3"))

    # The two teams at once, each its own tasks in order.
    await asyncio.gather(*(submit_eight(team) for team in QUOTAS))
    # `small`'s last task waits on its quota (one card; seven ahead of it of three seconds).
    shown = _ok(await teams.cp.cli("task", "get", ids["small"][-1], token=teams.tokens["small"]))
    assert "reason: quota (workspace small holds its GPU quota" in shown, shown
    records = await _ended(teams, ids["small"] + ids["large"])
    assert {r.state for r in records.values()} == {"succeeded"}, {
        t: (r.state, r.reason) for t, r in records.items()
    }
    ended = list(records.values())
    peaks = dict.fromkeys(QUOTAS, 0)
    for record in ended:
        held = _held_at(ended, _placed_at(record))
        for team, quota in QUOTAS.items():
            assert held.get(team, 0) <= quota, (team, held, record.task_id)
            peaks[team] = max(peaks[team], held.get(team, 0))
    assert peaks == QUOTAS, "each workspace reached its quota while both had work waiting"
    # Within a workspace, first in first out: its tasks were placed in the order submitted.
    for team in QUOTAS:
        placed = sorted(ids[team], key=lambda t: _placed_at(records[t]))
        assert placed == ids[team], team


async def test_borrowed_work_is_taken_back_newest_first_for_a_workspace_within_quota(
    teams: Teams,
) -> None:
    # Long enough that all five run at once even when five CLI submits and their placements
    # crawl on a loaded machine (the check below needs them all running together).
    borrowed = [await _submit(teams, "small", "sleep", "45", borrow=True) for _ in range(5)]

    async def all_running() -> bool:
        records = await _records(teams, borrowed)
        return all(r.state == "running" for r in records.values())

    await eventually(all_running, within=WITHIN)
    running = await _records(teams, borrowed)
    assert sum(r.borrowed for r in running.values()) == 4, "one within its quota, four borrowed"
    shown = _ok(await teams.cp.cli("task", "get", borrowed[-1], token=teams.tokens["small"]))
    assert " borrowed" in shown
    owner = await _submit(teams, "large", "sleep", "1", gpus=2)
    records = await _ended(teams, [*borrowed, owner])
    assert records[owner].state == "succeeded", records[owner].reason
    taken = [t for t in borrowed if records[t].state == "cancelled"]
    assert taken, {t: (r.state, r.reason) for t, r in records.items()}
    for task_id in taken:
        assert records[task_id].borrowed
        assert "preempted: reclaimed by workspace large" in records[task_id].reason
    # The newest borrowed tasks were the ones taken back; the others finished their work.
    kept = [t for t in borrowed if t not in taken]
    assert {records[t].state for t in kept} == {"succeeded"}
    kept_borrowed = [records[t].created_at for t in kept if records[t].borrowed]
    if kept_borrowed:
        assert max(kept_borrowed) < min(records[t].created_at for t in taken)
    # large's task runs on the cards taken back (its record's worker and cards are theirs).
    freed = {(records[t].worker_id, card) for t in taken for card in records[t].gpu_indices}
    got = {(records[owner].worker_id, card) for card in records[owner].gpu_indices}
    assert got <= freed, (got, freed)


async def test_work_taken_back_with_a_retry_left_queues_again_and_finishes(teams: Teams) -> None:
    borrowed = [
        await _submit(teams, "small", "sleep", "30", borrow=True, retries=1) for _ in range(5)
    ]

    async def all_running() -> bool:
        records = await _records(teams, borrowed)
        return all(r.state == "running" for r in records.values())

    await eventually(all_running, within=WITHIN)
    owner = await _submit(teams, "large", "sleep", "1", gpus=2)
    records = await _ended(teams, [*borrowed, owner])
    assert {r.state for r in records.values()} == {"succeeded"}, {
        t: (r.state, r.reason, r.attempts) for t, r in records.items()
    }
    requeued = [t for t in borrowed if records[t].attempts]
    assert requeued, "large's two cards came from borrowed work taken back"
    for task_id in requeued:
        [attempt] = records[task_id].attempts
        assert attempt.state == "preempted"
        assert attempt.reason == "preempted: reclaimed by workspace large"
        assert attempt.placed_at is not None
        assert attempt.finished_at is not None
        # Placed again once its first attempt had ended (its cards given back first).
        assert _placed_at(records[task_id]) >= attempt.finished_at
    freed = {(records[t].attempts[0].worker_id, c) for t in requeued for c in
             records[t].attempts[0].gpu_indices}  # fmt: skip
    got = {(records[owner].worker_id, card) for card in records[owner].gpu_indices}
    assert got <= freed, (got, freed)
    shown = _ok(await teams.cp.cli("task", "get", requeued[0], token=teams.tokens["small"]))
    assert "attempt 2 of at most 2; earlier:" in shown, shown
    assert "1. preempted exit_code=" in shown, shown
    assert "reclaimed by workspace large" in shown, shown


async def test_max_queued_refuses_the_submit_and_starts_nothing(teams: Teams) -> None:
    _ok(await teams.cp.cli("workspace", "set", "small", "--max-queued", "1"))
    # `small` holds its one card with a task that outlives the test (cancelled at its end), then
    # one waits: the third is refused. (A 20 s holder once ended between the check and the
    # third submit on a loaded CI machine: the waiting task was placed and the third accepted.)
    first = await _submit(teams, "small", "sleep", "600")
    second = await _submit(teams, "small", "sleep", "1")
    third: subprocess.CompletedProcess[str] | None = None
    try:

        async def second_waits() -> bool:
            records = await _records(teams, [first, second])
            return records[first].state == "running" and records[second].state == "queued"

        async def pool_counts_it() -> bool:
            # What the submit checks: the tasks the pool's queue holds for the workspace. A
            # record reads queued from its start, before its request reaches the pool (once
            # seen on the CI machine: the third submit came in between and was accepted).
            handle = teams.client.get_workflow_handle(pool_workflow_id(POOL))
            waiting: int = await handle.query("waiting_count", "small", result_type=int)
            return waiting == 1

        await eventually(second_waits, within=WITHIN)
        await eventually(pool_counts_it, within=WITHIN, what="the pool's queue holding one")
        before = json.loads(
            _ok(await teams.cp.cli("task", "list", "-o", "json", token=teams.tokens["small"]))
        )
        third = await teams.cp.cli(
            "run", "--pool", POOL, "--detach", "--", "true", token=teams.tokens["small"]
        )
        assert third.returncode != 0, third.stdout
        assert "max-queued (1)" in third.stderr + third.stdout
        assert "levers9 workspace set small --max-queued" in third.stderr + third.stdout
        after = json.loads(
            _ok(await teams.cp.cli("task", "list", "-o", "json", token=teams.tokens["small"]))
        )
        assert len(after) == len(before), "nothing was started"
        _ok(await teams.cp.cli("task", "cancel", first, token=teams.tokens["small"]))
        records = await _ended(teams, [first, second])
        assert records[second].state == "succeeded"
    finally:  # nothing of this test's left queued or running for the module's next ones
        accepted = [third.stdout.strip()] if third is not None and third.returncode == 0 else []
        for task_id in (first, second, *accepted):
            await teams.cp.cli("task", "cancel", task_id, token=teams.tokens["small"])
        _ok(await teams.cp.cli("workspace", "set", "small", "--max-queued", "100"))


async def test_an_endpoint_scaling_up_waits_under_its_workspaces_quota_and_says_so(
    teams: Teams,
) -> None:
    """One ledger: `small` (quota 1) holds its card with a task, so its endpoint's replica
    waits like a task would, and `endpoint get` says why."""
    _ok(await teams.cp.cli("workspace", "set", "small", "--max-queued", "100"))
    holder = await _submit_once_admitted(teams, "small", "sleep", "120")

    async def holding() -> bool:
        return (await _records(teams, [holder]))[holder].state == "running"

    await eventually(holding, within=WITHIN)
    made = await teams.cp.cli(
        "endpoint", "create", "ep-small", "--pool", POOL, "--gpus", "1", "--port", "8080",
        "--min-replicas", "1", "--", "sleep", "600",
        token=teams.tokens["small"],
    )  # fmt: skip
    _ok(made)
    try:
        shown: list[str] = []

        async def says_quota() -> bool:
            got = await teams.cp.cli("endpoint", "get", "ep-small", token=teams.tokens["small"])
            shown.append(got.stdout + got.stderr)
            return "scaling up waits: workspace small holds its GPU quota" in got.stdout

        await eventually(says_quota, within=WITHIN, what="the endpoint says quota")
        assert "quota (1 of 1)" in shown[-1], shown[-1]
    finally:
        await teams.cp.cli("endpoint", "delete", "ep-small", token=teams.tokens["small"])
        _ok(await teams.cp.cli("task", "cancel", holder, token=teams.tokens["small"]))
