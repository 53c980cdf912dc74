"""Durable disks end to end, on the sandbox's pool with containers (runc), through the CLI as a
user drives it: `disk create scratch --size 64Mi` puts the disk on a machine and says which;
`disk list -o json` names that machine; a task with `--disk scratch:/data` runs there, and its
write of 100 MiB ends in ENOSPC (the disk's size is enforced in the task, not the node's disk),
and once it ends `disk list` shows the disk's use; a later task on the same disk, also placed on
that machine, reads what the first wrote; the disk cannot be deleted while a task that mounts it
runs (the refusal names the task), and is deleted once none does, its file removed from its node
by the agent there.

A disk's files go to a workspace volume and back (`disk snapshot NAME --to VOLUME/PATH`, `disk
create NAME --from VOLUME/PATH`, each a task on the disk's machine), against an S3 that checks
credentials (moto, tests/buckets.py): the objects are in the bucket, a new disk made from them
holds the file, and a copy from a path with nothing there deletes the disk it made, saying so.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.cli.task import DEADLINE_EXIT
from levers9.models import TERMINAL
from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.buckets import checking_s3
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


async def test_a_disk_is_snapshotted_to_a_volume_and_a_new_disk_made_from_it(
    plane: Controlplane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("snapshots")
    with checking_s3(directory / "moto.log") as s3:
        s3.client().create_bucket(Bucket="levers9-snapshots")
        credentials = directory / "credentials"
        credentials.write_text(
            f"[default]\naws_access_key_id = {s3.allowed.access_key_id}\n"
            f"aws_secret_access_key = {s3.allowed.secret_access_key}\n"
        )
        _ok(
            await plane.cli(
                *("volume", "create", "backups", "--bucket", "s3://levers9-snapshots/kept"),
                *("--endpoint", s3.endpoint, "--credentials-file", str(credentials)),
            )
        )
        _ok(await plane.cli("disk", "create", "source", "--size", "64Mi", "--pool", POOL))
        _ok(
            await plane.cli(
                "run", "--pool", POOL, "--gpus", "0", "--disk", "source:/data", "--",
                "sh", "-c", "echo kept-on-the-disk > /data/kept.txt && mkdir /data/sub"
                " && head -c 3000000 /dev/zero > /data/sub/zeros",
            )
        )  # fmt: skip

        snapped = await plane.cli("disk", "snapshot", "source", "--to", "backups/snaps/one")
        out = _ok(snapped)
        assert "levers9-copy: copying 2 files, 3000017 bytes" in out
        assert (
            "disk source snapshotted to volume backups/snaps/one: 2 files, 3000017 bytes"
            " (2.9Mi) under s3://levers9-snapshots/kept/snaps/one/" in out
        ), out
        got = s3.client().get_object(Bucket="levers9-snapshots", Key="kept/snaps/one/kept.txt")
        assert got["Body"].read() == b"kept-on-the-disk\n"
        zeros = s3.client().head_object(Bucket="levers9-snapshots", Key="kept/snaps/one/sub/zeros")
        assert zeros["ContentLength"] == 3_000_000
        listed = s3.client().list_objects_v2(Bucket="levers9-snapshots", Prefix="kept/")
        assert "lost+found" not in json.dumps([o["Key"] for o in listed["Contents"]])

        # A snapshot never mixes with an earlier one.
        again = await plane.cli("disk", "snapshot", "source", "--to", "backups/snaps/one")
        assert again.returncode == 1
        assert (
            "snapshot of disk source failed: volume backups/snaps/one already holds files:"
            " choose another path" in again.stdout + again.stderr
        )

        made = await plane.cli(
            "disk", "create", "restored", "--size", "32Mi", "--pool", POOL,
            "--from", "backups/snaps/one",
        )  # fmt: skip
        out = _ok(made)
        assert "disk restored filled from volume backups/snaps/one: 2 files" in out
        read = await plane.cli(
            "run", "--pool", POOL, "--gpus", "0", "--disk", "restored:/data", "--",
            "sh", "-c", "cat /data/kept.txt && wc -c < /data/sub/zeros",
        )  # fmt: skip
        out = _ok(read)
        assert "kept-on-the-disk" in out
        assert "3000000" in out

        # Nothing under the path: the disk it made is deleted again, and that is said.
        empty = await plane.cli(
            "disk", "create", "hollow", "--size", "32Mi", "--pool", POOL,
            "--from", "backups/snaps/none",
        )  # fmt: skip
        assert empty.returncode == 1
        said = empty.stdout + empty.stderr
        assert "nothing to copy at volume backups/snaps/none" in said
        assert "disk hollow was deleted again" in said
        assert f"levers9 disk create hollow --size 32Mi --pool {POOL} --from" in said
        listed = await plane.cli("disk", "list", "--workspace", "default", "-o", "json")
        assert sorted(d["name"] for d in json.loads(_ok(listed))) == ["restored", "source"]
        # A volume the workspace does not have: said before any disk is made.
        missing = await plane.cli(
            "disk", "create", "never", "--size", "32Mi", "--pool", POOL, "--from", "nope/x"
        )
        assert missing.returncode == 1
        assert "no volume nope" in missing.stdout + missing.stderr

        # A volume whose key S3 refuses: the snapshot fails at its start, naming the volume.
        denied = directory / "denied"
        denied.write_text(
            f"[default]\naws_access_key_id = {s3.denied.access_key_id}\n"
            f"aws_secret_access_key = {s3.denied.secret_access_key}\n"
        )
        _ok(
            await plane.cli(
                *("volume", "create", "walled", "--bucket", "s3://levers9-snapshots/walled"),
                *("--endpoint", s3.endpoint, "--credentials-file", str(denied), "--no-check"),
            )
        )
        refused = await plane.cli("disk", "snapshot", "source", "--to", "walled/x")
        assert refused.returncode == 1
        said = refused.stdout + refused.stderr
        assert "snapshot of disk source failed: volume walled: AccessDenied" in said, said
        assert "nothing was copied" in said

        # The disk held by a running task: the snapshot waits for it, saying so, then runs.
        held = await plane.cli(
            "run", "--pool", POOL, "--gpus", "0", "--disk", "source:/data", "--detach", "--",
            "sleep", "300",
        )  # fmt: skip
        holder = _ok(held).strip()
        # It waits all of --wait (the holder sleeps on): the command says why, and that the
        # copy goes on; once the holder is cancelled, the copy runs to its end.
        waited = await plane.cli(
            "disk", "snapshot", "source", "--to", "backups/snaps/two", "--wait", "12"
        )
        said = waited.stdout + waited.stderr
        assert waited.returncode == DEADLINE_EXIT, said
        assert f"the copy waits: waiting for disk source: task {holder} uses it" in said, said
        found = re.search(
            r"DEADLINE_EXCEEDED: the snapshot of disk source goes on as task (\w+)", said
        )
        assert found is not None, said
        _ok(await plane.cli("task", "cancel", holder))
        client = await connect(plane.settings)

        async def copied() -> bool:
            record = await task_record(client, found[1])
            return record is not None and record.state in TERMINAL

        await eventually(copied, within=WITHIN)
        record = await task_record(client, found[1])
        assert record is not None
        assert record.state == "succeeded", record.log_tail
        assert "levers9-copy: done files=2 bytes=3000017" in record.log_tail
        kept = s3.client().get_object(Bucket="levers9-snapshots", Key="kept/snaps/two/kept.txt")
        assert kept["Body"].read() == b"kept-on-the-disk\n"

        _ok(await plane.cli("volume", "delete", "walled"))
        for disk in ("source", "restored"):
            _ok(await plane.cli("disk", "delete", disk))
        _ok(await plane.cli("volume", "delete", "backups"))
