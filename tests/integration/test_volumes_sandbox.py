"""Workspace volumes end to end on the sandbox, with tasks in containers and an S3 that checks
credentials (moto, tests/buckets.py), driven by the real CLI as a team drives it:

- a task writes /data/out.txt to a volume; once it ended the object is in the bucket (read with
  boto3), and a second task reads it back;
- a volume recorded with a wrong secret (`--no-check`) fails its task at start, the reason
  naming the volume and S3's error, and the next task on the same worker runs;
- the key appears in no workflow history, memo or search attribute of the controlplane's task
  queue, no log line of the controlplane or the workers, no Kubernetes object, no file under the
  test's directory (the sandbox's state and its nodes' files, the agents' work dirs among them),
  and no environment of a task's processes (`/proc/*/environ`, read by a task that mounts the
  volume).

The tests of this module share one sandbox, controlplane and S3, and run in order.
"""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.contract import WORK_ROOT
from levers9.models import TERMINAL, TaskRecord
from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.buckets import CheckingS3, checking_s3
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.reliability.secrets_scan import corpus_of_json
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
TEAM = "team-v"
BUCKET = "levers9-team-v"


@dataclass
class Volumes:
    cp: Controlplane
    s3: CheckingS3
    client: Client
    directory: Path
    token: str
    credentials: Path

    async def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await self.cp.cli(*args, token=self.token)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def volumes(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Volumes]:
    directory = tmp_path_factory.mktemp("volumes")
    with checking_s3(directory / "moto.log") as s3:
        s3.client().create_bucket(Bucket=BUCKET)
        credentials = directory / "team-credentials"
        credentials.write_text(
            f"[default]\naws_access_key_id = {s3.allowed.access_key_id}\n"
            f"aws_secret_access_key = {s3.allowed.secret_access_key}\n"
        )
        async with reconciling(dev_env.client, directory, containers=True) as plane:
            await eventually(lambda: workers_available(plane), within=WITHIN)
            _ok(await plane.cli("workspace", "create", TEAM))
            token = _ok(await plane.cli("workspace", "token", "create", TEAM)).strip()
            yield Volumes(plane, s3, await connect(plane.settings), directory, token, credentials)


async def _ended(volumes: Volumes, task_id: str) -> TaskRecord:
    record: TaskRecord | None = None

    async def ended() -> bool:
        nonlocal record
        record = await task_record(volumes.client, task_id)
        return record is not None and record.state in TERMINAL

    await eventually(ended, within=WITHIN)
    assert record is not None
    return record


async def _run(volumes: Volumes, *args: str) -> TaskRecord:
    done = await volumes.cli("run", "--pool", POOL, "--gpus", "0", "--detach", *args)
    return await _ended(volumes, _ok(done).strip().splitlines()[-1])


async def test_a_task_writes_an_object_a_second_task_reads(volumes: Volumes) -> None:
    _ok(
        await volumes.cli(
            *("volume", "create", "data", "--bucket", f"s3://{BUCKET}/runs"),
            *("--endpoint", volumes.s3.endpoint, "--credentials-file", str(volumes.credentials)),
        )
    )
    written = await _run(
        volumes, "--volume", "data:/data", "--", "sh", "-c", "echo hello-volume > /data/out.txt"
    )
    assert (written.state, written.exit_code) == ("succeeded", 0), written.reason
    got = volumes.s3.client().get_object(Bucket=BUCKET, Key="runs/out.txt")
    assert got["Body"].read() == b"hello-volume\n"
    read = await volumes.cli(
        *("run", "--pool", POOL, "--gpus", "0", "--volume", "data:/in:ro"),
        *("--", "cat", "/in/out.txt"),
    )
    assert read.returncode == 0, read.stdout + read.stderr
    assert "hello-volume" in read.stdout


async def test_a_volume_of_bad_credentials_fails_its_task_at_start_naming_it(
    volumes: Volumes,
) -> None:
    wrong = volumes.directory / "wrong-credentials"
    wrong.write_text(
        f"[default]\naws_access_key_id = {volumes.s3.allowed.access_key_id}\n"
        f"aws_secret_access_key = wrong-{uuid.uuid4().hex}\n"
    )
    refused = await volumes.cli(
        *("volume", "create", "bad", "--bucket", f"s3://{BUCKET}/runs"),
        *("--endpoint", volumes.s3.endpoint, "--credentials-file", str(wrong)),
    )
    assert refused.returncode == 1
    assert "volume bad: SignatureDoesNotMatch" in refused.stderr
    _ok(
        await volumes.cli(
            *("volume", "create", "bad", "--bucket", f"s3://{BUCKET}/runs", "--no-check"),
            *("--endpoint", volumes.s3.endpoint, "--credentials-file", str(wrong)),
        )
    )
    failed = await _run(volumes, "--volume", "bad:/data", "--", "true")
    assert failed.state == "failed"
    assert "volume bad: SignatureDoesNotMatch" in failed.reason, failed.reason
    after = await _run(volumes, "--", "true")
    assert after.state == "succeeded", after.reason


async def _scanned_temporal(volumes: Volumes) -> str:
    query = f"TaskQueue='{volumes.cp.settings.task_queue}'"
    texts = []
    async for execution in volumes.client.list_workflows(query):
        handle = volumes.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        texts.append(corpus_of_json((await handle.fetch_history()).to_json()))
        texts.append(json.dumps(await execution.memo(), default=str))
        texts.append(str(execution.raw_info.search_attributes))
    assert len(texts) > 3 * 5, "the task queue's workflows were listed"
    return "\n".join(texts)


async def _scanned_kubernetes(volumes: Volumes) -> str:
    kinds = "pods,jobs,secrets,configmaps,events"
    objects = await volumes.cp.kubectl("get", kinds, "-A", "-o", "json")
    pods = json.loads(await volumes.cp.kubectl("get", "pods", "-A", "-o", "json"))["items"]
    logs = [
        await volumes.cp.kubectl("logs", "-n", p["metadata"]["namespace"], p["metadata"]["name"])
        for p in pods
    ]
    assert any("levers9" in line for line in logs), "the workers' logs were read"
    return objects + "\n".join(logs)


def _scanned_files(directory: Path, skip: set[Path]) -> str:
    texts = []
    work_files = 0
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink() and path not in skip:
            try:
                texts.append(path.read_bytes().decode("utf-8", errors="replace"))
            except OSError:
                continue
            work_files += WORK_ROOT in str(path)
    assert work_files > 0, "the agents' work dirs on the nodes were read"
    return "\n".join(texts)


async def test_the_key_is_in_no_history_log_object_file_or_task_environment(
    volumes: Volumes, log_lines: io.StringIO
) -> None:
    env = await volumes.cli(
        *("run", "--pool", POOL, "--gpus", "0", "--volume", "data:/data"),
        *("--", "sh", "-c", "cat /proc/*/environ | tr '\\0' '\\n'; ls /data"),
    )
    assert env.returncode == 0, env.stdout + env.stderr
    assert "PATH=" in env.stdout  # the environments were read
    assert "out.txt" in env.stdout  # with the volume mounted
    key = volumes.s3.allowed.secret_access_key
    key_id = volumes.s3.allowed.access_key_id
    scanned = {
        "the task's environment": env.stdout + env.stderr,
        "temporal": await _scanned_temporal(volumes),
        "the controlplane's log": log_lines.getvalue(),
        "kubernetes": await _scanned_kubernetes(volumes),
        # The credentials files the test itself wrote hold it; moto's log is S3's own.
        "files": _scanned_files(
            volumes.directory,
            {volumes.credentials, volumes.directory / "wrong-credentials"},
        ),
    }
    assert "ciphertext" in scanned["temporal"]
    found = [where for where, text in scanned.items() if key in text or key_id in text]
    assert found == []
