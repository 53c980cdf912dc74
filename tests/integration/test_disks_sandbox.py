"""Durable disks end to end, on the sandbox's pool with containers (runc), through the CLI as a
user drives it: `disk create scratch --size 64Mi` puts the disk on a machine and says which;
`disk list -o json` names that machine; a task with `--disk scratch:/data` runs there, and its
write of 100 MiB ends in ENOSPC (the disk's size is enforced in the task, not the node's disk),
and once it ends `disk list` shows the disk's use; a later task on the same disk, also placed on
that machine, reads what the first wrote; the disk cannot be deleted while a task that mounts it
runs (the refusal names the task), and is deleted once none does, its file removed from its node
by the agent there.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
WRITE = (
    "echo kept-by-the-first-task > /data/kept.txt"
    " && if dd if=/dev/zero of=/data/fill bs=1M count=100 2>/tmp/dd.err;"
    " then echo wrote-100MiB; else cat /tmp/dd.err; fi; rm -f /data/fill; df -k /data"
)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("disks"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def _node_of(plane: Controlplane, task_id: str) -> str | None:
    record = await task_record(await connect(plane.settings), task_id)
    assert record is not None
    return record.node_name


def _task_id(output: str) -> str:
    """The id `levers9 run` prints first (`task ID submitted to pool P, ...`)."""
    found = re.search(r"^task (\w+) submitted", output, re.MULTILINE)
    assert found is not None, output
    return found[1]


async def test_a_disk_keeps_a_tasks_data_on_its_machine_and_enforces_its_size(
    plane: Controlplane,
) -> None:
    made = _ok(await plane.cli("disk", "create", "scratch", "--size", "64Mi", "--pool", POOL))
    [disk] = json.loads(_ok(await plane.cli("disk", "list", "-o", "json")))
    machine = disk["machine"]
    assert f"64Mi on machine {machine} of pool {POOL}" in made
    assert (disk["name"], disk["size"], disk["state"]) == ("scratch", "64Mi", "ready")

    first = await plane.cli(
        "run", "--pool", POOL, "--gpus", "0", "--disk", "scratch:/data", "--",
        "sh", "-c", WRITE,
    )  # fmt: skip
    out = _ok(first)
    assert "No space left on device" in out
    assert "wrote-100MiB" not in out
    assert await _node_of(plane, _task_id(out)) == machine
    # Its end has the disk's record read the disk's use on its node: `disk list` shows it.
    listed: list[dict[str, object]] = []

    async def used_shown() -> bool:
        [row] = json.loads(_ok(await plane.cli("disk", "list", "-o", "json")))
        listed.append(row)
        return isinstance(row["used_bytes"], int) and row["used_bytes"] > 0

    await eventually(used_shown, within=30)
    assert listed[-1]["used"] != "-"

    second = await plane.cli(
        "run", "--pool", POOL, "--gpus", "0", "--disk", "scratch:/data", "--",
        "cat", "/data/kept.txt",
    )  # fmt: skip
    out = _ok(second)
    assert "kept-by-the-first-task" in out
    assert await _node_of(plane, _task_id(out)) == machine

    # A task that mounts it runs: the delete is refused, naming it; once it ends, it goes.
    held = await plane.cli(
        "run", "--pool", POOL, "--gpus", "0", "--disk", "scratch:/data", "--detach", "--",
        "sleep", "300",
    )  # fmt: skip
    task_id = _ok(held).strip()
    refused = await plane.cli("disk", "delete", "scratch")
    assert refused.returncode == 1
    assert f"disk scratch is in use by task {task_id}" in refused.stdout + refused.stderr
    _ok(await plane.cli("task", "cancel", task_id))
    deleted: list[str] = []

    async def delete() -> bool:  # the pool has the cancelled task's release a moment later
        done = await plane.cli("disk", "delete", "scratch")
        deleted.append(done.stdout + done.stderr)
        return done.returncode == 0

    await eventually(delete, within=30)
    assert f"disk scratch deleted: its file removed from node {machine}" in deleted[-1]
    assert json.loads(_ok(await plane.cli("disk", "list", "-o", "json"))) == []


async def test_a_workspace_sees_only_its_own_disks_through_the_cli(plane: Controlplane) -> None:
    for team in ("team-d", "team-e"):
        _ok(await plane.cli("workspace", "create", team))
    d = _ok(await plane.cli("workspace", "token", "create", "team-d")).strip()
    e = _ok(await plane.cli("workspace", "token", "create", "team-e")).strip()
    made = _ok(await plane.cli("disk", "create", "notes", "--size", "32Mi", token=d))
    assert "disk notes created in workspace team-d: 32Mi on machine" in made
    [mine] = json.loads(_ok(await plane.cli("disk", "list", "-o", "json", token=d)))
    assert (mine["name"], mine["workspace"]) == ("notes", "team-d")
    assert json.loads(_ok(await plane.cli("disk", "list", "-o", "json", token=e))) == []
    missing = await plane.cli("disk", "get", "nothing", token=e)
    for args in (("get", "notes"), ("delete", "notes")):
        theirs = await plane.cli("disk", *args, token=e)
        assert theirs.returncode == missing.returncode == 1
        assert "NOT_FOUND: no disk notes" in theirs.stdout + theirs.stderr
    refused = await plane.cli(
        "run", "--pool", POOL, "--gpus", "0", "--disk", "notes:/data", "--", "true", token=e
    )
    assert refused.returncode != 0
    assert "no disk notes in workspace team-e" in refused.stdout + refused.stderr
    # Still d's, as it was.
    [kept] = json.loads(_ok(await plane.cli("disk", "list", "-o", "json", token=d)))
    assert kept == mine
