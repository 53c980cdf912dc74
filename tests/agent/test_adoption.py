"""A `levers9-worker` agent SIGKILLed while its containers run, and started again on the same
work dir, adopts them: a task's output before and after the kill, its exit status and result
are reported once, by the new agent; a container it finds no record of is killed and its task
reported lost, and so is a task that ran as a process of the killed agent; the cards of what
ended (and only those) are free again, and nothing of the containers (runc state, cgroup,
overlay) is left once they end. Real agents (the command), real runc and a real registry; root
only, as runc is.

Its agents take the agent's tests' knob (`LEVERS9_PROCESS_TASKS`, which no Job sets) for its one
task that names no image: what a killed agent leaves of a process task is part of adoption's
contract (a restarted agent finds and kills it), though no product path starts one any more.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from grpc import aio

from levers9.agent.cgroups import cgroup_dirs
from levers9.agent.paths import MOUNTS_ENV, ROOT_ENV
from levers9.agent.task_network import TaskNetworks
from levers9.contract import DEVICE_PLUGIN_DIR
from levers9.proto import worker_pb2, worker_pb2_grpc
from sandbox.cluster.kubelet import make_device_nodes
from sandbox.registries import LocalRegistry
from tests.agent.conftest import BUCKET, S3
from tests.agent.kit import AUTH, POD_UID, TOKEN, write_checkpoint
from tests.agent.recording_gateway import Calls, RecordingGateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]
WORKER_COMMAND = Path(sys.executable).parent / "levers9-worker"
RUNNING = worker_pb2.TASK_STATE_RUNNING
KEPT = (
    "echo before; while [ ! -e /levers9/go ]; do sleep 0.1; done; echo after;"
    ' echo \'{"ok": 1}\' > "$LEVERS9_RESULT_PATH"; exit 3'
)
"""Prints, waits for the test's word (a file in its result folder), prints, ends with 3."""


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """The agents' work dir; whatever a failed test left in its runc root (and its tasks'
    networks) is removed after."""
    work = tmp_path / "work"
    yield work
    _remove_containers(work)


@pytest.fixture
def runc_env(
    gateway: RecordingGateway, node_root: Path, image: tuple[LocalRegistry, str], work: Path
) -> dict[str, str]:
    """A 2-card worker's environment, with an image cache, its registry and a work dir."""
    write_checkpoint(node_root, ["nvidia0", "nvidia1"], {POD_UID: ["nvidia0", "nvidia1"]})
    libraries = node_root / "usr/local/nvidia/lib64"
    libraries.mkdir(parents=True)
    (libraries / "libnvidia-ml.so.1").write_text("the node's driver")
    make_device_nodes(node_root / "dev", 2)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LEVERS9_GATEWAY_ADDRESS": gateway.address,
        "LEVERS9_POOL_NAME": "gke-rtx6000",
        "LEVERS9_WORKER_ID": "w1",
        "LEVERS9_WORKER_TOKEN": TOKEN,
        "LEVERS9_NODE_NAME": "node-a",
        "LEVERS9_POD_UID": POD_UID,
        "LEVERS9_ADVERTISED_HOST": "127.0.0.1",
        "LEVERS9_IMAGES_PATH": "/var/lib/levers9/images",
        "LEVERS9_INSECURE_REGISTRIES": image[0].address,
        "LEVERS9_WORK_DIR": str(work),
        "LEVERS9_PROCESS_TASKS": "true",
        ROOT_ENV: str(node_root),
        MOUNTS_ENV: json.dumps({DEVICE_PLUGIN_DIR: str(node_root / DEVICE_PLUGIN_DIR[1:])}),
    }


async def test_a_restarted_agent_adopts_its_containers_and_kills_the_unrecorded(
    gateway: RecordingGateway,
    runc_env: dict[str, str],
    image: tuple[LocalRegistry, str],
    work: Path,
    tmp_path: Path,
) -> None:
    first = await _agent(gateway, runc_env, tmp_path / "first.log")
    try:
        async with _worker(gateway) as stub:
            await stub.RunTask(_task("kept", image[1], ["sh", "-c", KEPT], card=0), metadata=AUTH)
            await stub.RunTask(_task("stray", image[1], ["sleep", "1000"], card=1), metadata=AUTH)
            await stub.RunTask(_task("process", "", ["sleep", "1000"], card=()), metadata=AUTH)
            await gateway.wait_for(_started("kept", "stray", "process"))
            [kept] = [json.loads(p.read_text()) for p in (work / "processes").glob("*.json")]
            assert kept["task_id"] == "process"
            process = kept["pid"]
            await _eventually(lambda: "before" in _output(work, "kept"))
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    # The stray's container runs on; what the agent kept of it is gone.
    (work / "containers" / "l9-stray.json").unlink()
    (_task_dir(work, "stray") / "task.json").unlink()

    second = await _agent(gateway, runc_env, tmp_path / "second.log")
    try:
        await gateway.wait_for(_ended("stray"))
        [stray] = _ends(gateway.calls, "stray")
        assert stray.state == worker_pb2.TASK_STATE_LOST
        assert "without a record: killed" in stray.reason
        assert cgroup_dirs("stray") == [], "the stray container and its cgroup are gone"
        await gateway.wait_for(_ended("process"))
        [orphan] = _ends(gateway.calls, "process")
        assert (orphan.state, orphan.reason) == (
            worker_pb2.TASK_STATE_LOST,
            "the worker restarted and could not follow it (killed, if it still ran)",
        )
        assert not _alive(process), "a task the killed agent ran as its process is killed"
        async with _worker(gateway) as stub:
            card_1 = _task("next", image[1], ["true"], card=1)
            await stub.RunTask(card_1, metadata=AUTH)
            await gateway.wait_for(_ended("next"))
            assert [e.state for e in _ends(gateway.calls, "next")] == [
                worker_pb2.TASK_STATE_SUCCEEDED
            ], "the stray's card is free again"
            await stub.RunTask(_task("busy", image[1], ["true"], card=0), metadata=AUTH)
            await gateway.wait_for(_ended("busy"))
            [busy] = _ends(gateway.calls, "busy")
            assert "not enough GPUs available" in busy.reason, "the adopted task holds its card"

            (_task_dir(work, "kept") / "result" / "go").write_text("")
            await gateway.wait_for(_ended("kept"))
            got = await stub.GetTask(worker_pb2.GetTaskRequest(task_id="kept"), metadata=AUTH)
            beats = len(gateway.calls.heartbeats)
            await gateway.wait_for(lambda calls: len(calls.heartbeats) >= beats + 2)
        [kept] = _ends(gateway.calls, "kept")
        assert (kept.state, kept.exit_code, kept.reason) == (
            worker_pb2.TASK_STATE_FAILED,
            3,
            "exited with code 3",
        )
        assert kept.log_tail == "before\nafter\n", "its output from both agents, once"
        assert json.loads(kept.result_json) == {"ok": 1}
        assert (got.state, got.exit_code) == (kept.state, 3)
        assert "container.exit" in [p.name for p in kept.phases]
        assert _runc_list(work) == [], "no container of either agent is left"
        assert cgroup_dirs("kept") == []
        assert " overlay " not in _mounts_under(tmp_path)
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 30)


# -- helpers -----------------------------------------------------------------------------------


async def _agent(
    gateway: RecordingGateway, env: dict[str, str], log: Path
) -> asyncio.subprocess.Process:
    """The `levers9-worker` command, once it has registered."""
    registered = len(gateway.calls.registers) + 1
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            str(WORKER_COMMAND), env=env, stdout=sink, stderr=sink
        )
    await gateway.wait_for(lambda calls: len(calls.registers) >= registered)
    return process


class _worker:
    """WorkerService of the agent that registered last."""

    def __init__(self, gateway: RecordingGateway) -> None:
        address = gateway.calls.registers[-1][0].advertised_address
        self._channel = aio.insecure_channel(address)

    async def __aenter__(self) -> worker_pb2_grpc.WorkerServiceAsyncStub:
        return worker_pb2_grpc.WorkerServiceStub(self._channel)

    async def __aexit__(self, *_: object) -> None:
        await self._channel.close()


def _task(
    task_id: str, image: str, command: list[str], card: int | tuple[()]
) -> worker_pb2.RunTaskRequest:
    cards = [card] if isinstance(card, int) else []
    return worker_pb2.RunTaskRequest(
        task=worker_pb2.TaskSpec(task_id=task_id, image=image, command=command, gpu_indices=cards)
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _ends(calls: Calls, task_id: str) -> list[worker_pb2.TaskStatus]:
    return [
        r.status for r in calls.reports if r.status.task_id == task_id and r.status.state != RUNNING
    ]


def _ended(task_id: str) -> Callable[[Calls], bool]:
    return lambda calls: bool(_ends(calls, task_id))


def _started(*task_ids: str) -> Callable[[Calls], bool]:
    def started(calls: Calls) -> bool:
        running = {r.status.task_id for r in calls.reports if r.status.state == RUNNING}
        return running >= set(task_ids)

    return started


def _task_dir(work: Path, task_id: str) -> Path:
    [directory] = (work / "tasks").glob(f"{task_id}-*")
    return directory


def _output(work: Path, task_id: str) -> str:
    return (_task_dir(work, task_id) / "output.log").read_text()


async def _eventually(check: Callable[[], bool], within: float = 30) -> None:
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - a file another process writes
            await asyncio.sleep(0.05)


def _runc_list(work: Path) -> list[str]:
    listed = subprocess.run(
        ["runc", "--root", str(work / "runc"), "list", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    return listed.stdout.split()


def _mounts_under(path: Path) -> str:
    return "".join(
        line for line in Path("/proc/mounts").read_text().splitlines(True) if str(path) in line
    )


def _remove_containers(work: Path) -> None:
    for name in _runc_list(work):
        subprocess.run(
            ["runc", "--root", str(work / "runc"), "delete", "--force", name], check=False
        )
    if (work / "networks").is_dir():  # their slirp4netns run in sessions of their own
        TaskNetworks(work / "networks").sweep(keep=())
    for line in _mounts_under(work).splitlines():
        subprocess.run(["umount", "-l", line.split()[1]], check=False)


async def test_a_restarted_agent_adopts_a_task_with_its_volume_and_disk(
    gateway: RecordingGateway,
    runc_env: dict[str, str],
    image: tuple[LocalRegistry, str],
    s3: S3,
    node_root: Path,
    work: Path,
    tmp_path: Path,
) -> None:
    """The FUSE process and the disk's mount outlive a SIGKILLed agent; the next one adopts the
    task, and at its end the object is in the bucket and nothing is left mounted."""
    env = {**runc_env, "LEVERS9_DURABLE_DISKS_PATH": "/var/lib/levers9/disks"}
    script = (
        "echo before; while [ ! -e /levers9/go ]; do sleep 0.1; done;"
        " echo adopted > /data/adopted.txt && echo kept > /scratch/kept && echo after"
    )
    request = _task("mounts", image[1], ["sh", "-c", script], card=())
    request.task.mounts.extend(
        [
            worker_pb2.TaskMount(kind="volume", name="data", path="/data"),
            worker_pb2.TaskMount(kind="disk", name="scratch", path="/scratch"),
        ]
    )
    request.volumes.append(s3.access())
    request.disks.append(
        worker_pb2.DiskAccess(name="scratch", disk_id="d-adopted", size_bytes=32 * 1024**2)
    )
    first = await _agent(gateway, env, tmp_path / "first.log")
    try:
        async with _worker(gateway) as stub:
            await stub.RunTask(request, metadata=AUTH)
            await gateway.wait_for(_started("mounts"))
            await _eventually(lambda: "before" in _output(work, "mounts"))
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    second = await _agent(gateway, env, tmp_path / "second.log")
    try:
        (_task_dir(work, "mounts") / "result" / "go").write_text("")
        await gateway.wait_for(_ended("mounts"))
        [ended] = _ends(gateway.calls, "mounts")
        assert ended.state == worker_pb2.TASK_STATE_SUCCEEDED, ended.reason
        assert ended.log_tail == "before\nafter\n"
        body = s3.client().get_object(Bucket=BUCKET, Key="runs/adopted.txt")["Body"].read()
        assert body == b"adopted\n", "uploaded before the end was reported"
        disks = node_root / "var/lib/levers9/disks"
        assert (disks / "d-adopted.ext4").exists(), "the disk's file stays"
        assert _mounts_under(work) == "", "its volume unmounted"
        assert _mounts_under(disks) == "", "its disk unmounted"
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 30)
