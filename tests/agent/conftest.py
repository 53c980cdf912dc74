"""Fixtures for the worker agent's tests: a node filesystem, a WorkerService on 127.0.0.1 with
the process runtime, a recording gateway, and an S3 (moto) that checks credentials."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from grpc import aio

from levers9.agent.driver import DriverSetup
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.server import WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.supervisor import TaskManager
from levers9.proto import worker_pb2, worker_pb2_grpc
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox
from tests.agent.kit import TOKEN
from tests.agent.recording_gateway import RecordingGateway
from tests.buckets import checking_s3

VISIBLE = (0, 1)
AGENT_ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LEVERS9_WORKER_TOKEN": TOKEN}
"""The agent's own environment as the runtime sees it: the token must not reach tasks."""


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    root.mkdir()
    return root


@dataclass
class ServedWorker:
    tasks: TaskManager
    server: WorkerServer
    stub: worker_pb2_grpc.WorkerServiceAsyncStub
    channel: aio.Channel
    reports: list[worker_pb2.TaskStatus]
    driver: DriverSetup


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServedWorker]:
    """WorkerService with two cards (0, 1) on 127.0.0.1, task ends collected in `reports`."""
    reports: list[worker_pb2.TaskStatus] = []
    driver = DriverSetup((), (tmp_path / "driver/bin",), ())
    tasks = TaskManager(
        ProcessRuntime(driver, AGENT_ENV), VISIBLE, tmp_path / "work", reports.append
    )
    server = await WorkerServer.start(WorkerService(tasks), TOKEN, "127.0.0.1")
    channel = aio.insecure_channel(server.advertised_address)
    try:
        yield ServedWorker(
            tasks, server, worker_pb2_grpc.WorkerServiceStub(channel), channel, reports, driver
        )
    finally:
        await tasks.shutdown(grace_s=1)
        await channel.close()
        await server.stop(0)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, str]]:
    """A registry on 127.0.0.1 holding the busybox task image; its reference."""
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as registry:
        layout = tmp_path_factory.mktemp("build") / "layout"
        build_busybox(layout, "bb", marker="runc")
        push_layout(layout, f"{registry.address}/tasks/busybox:bb", "bb")
        yield registry, f"{registry.address}/tasks/busybox:bb"


@pytest.fixture
async def gateway() -> AsyncIterator[RecordingGateway]:
    async with RecordingGateway() as started:
        yield started


BUCKET = "workspace-a"


@dataclass(frozen=True)
class S3:
    endpoint: str
    key_id: str
    secret: str
    denied_key_id: str
    """A user with no policy: S3 answers AccessDenied."""
    denied_secret: str
    reader_key_id: str
    """A user that may list and read, not write: a mount checks, an upload is refused."""
    reader_secret: str

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def access(self, name: str = "data", **changes: str) -> worker_pb2.VolumeAccess:
        fields = {
            "name": name,
            "bucket": f"s3://{BUCKET}/runs",
            "endpoint": self.endpoint,
            "region": "us-east-1",
            "access_key_id": self.key_id,
            "secret_access_key": self.secret,
            **changes,
        }
        return worker_pb2.VolumeAccess(**fields)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """tests.buckets' moto that checks credentials (a key allowed everything, one nothing, one
    reading only) and a bucket of the first's."""
    with checking_s3(tmp_path_factory.mktemp("moto") / "moto.log") as moto:
        world = S3(
            moto.endpoint,
            moto.allowed.access_key_id,
            moto.allowed.secret_access_key,
            moto.denied.access_key_id,
            moto.denied.secret_access_key,
            moto.reader.access_key_id,
            moto.reader.secret_access_key,
        )
        world.client().create_bucket(Bucket=BUCKET)
        yield world
