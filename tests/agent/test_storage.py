"""A task's volumes and disks with the real runc, rclone (FUSE) and a real moto S3 server that
checks credentials: a file a task writes to a volume is an object in the bucket once its end is
reported, and the next task reads it; `:ro` refuses writes; bad credentials, a missing bucket, a
denied user or an unreachable endpoint fail the task at start naming the volume and S3's error,
nothing left mounted; the credentials are in no environment of the task's processes and no file
bound into its container (only in the FUSE process's environment); a 64 MiB disk gives ENOSPC
to a task writing 100 MiB, keeps what it wrote for the next task, and is one task's at a time.
Root only (runc, FUSE and loop mounts).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from levers9.agent import volumes
from levers9.agent.disks import DiskAccess, DiskBusy, DiskStore, Owner
from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import container_id
from levers9.agent.runc_runtime import LAYER_FILE, RuncRuntime
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.runtime import StorageMount
from levers9.agent.server import WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.supervisor import TaskManager
from levers9.agent.task_errors import InvalidTask
from levers9.agent.task_storage import TaskStorage
from levers9.proto import worker_pb2, worker_pb2_grpc
from sandbox.registries import LocalRegistry
from tests.agent.conftest import BUCKET, S3
from tests.agent.kit import AUTH, TOKEN
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc, FUSE and loop mounts need root"),
    pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone is not installed"),
]


@pytest.fixture
def storage(tmp_path: Path) -> TaskStorage:
    return TaskStorage(tmp_path / "volumes", DiskStore(tmp_path / "durable-disks"))


@pytest.fixture
def runtime(
    image: tuple[LocalRegistry, str], tmp_path: Path, storage: TaskStorage
) -> Iterator[RuncRuntime]:
    os.environ.pop("AWS_CA_BUNDLE", None)  # rclone fails to load this machine's (MACHINE.md)
    registry, _ = image
    cache = ImageCache(tmp_path / "images", insecure=[registry.address])
    yield RuncRuntime(
        cache,
        tmp_path / "runc",
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
        cards=(),
        limits=Limits(memory_bytes=256 * 1024**2, cpus=1, pids=256),
        storage=storage,
    )
    storage.sweep(keep=())


@pytest.fixture
async def tasks(runtime: RuncRuntime, tmp_path: Path) -> AsyncIterator[TaskManager]:
    manager = TaskManager(runtime, (), tmp_path / "work", lambda _: None)
    yield manager
    await manager.shutdown(grace_s=1)


def _mount(kind: str, name: str, path: str, read_only: bool = False) -> worker_pb2.TaskMount:
    return worker_pb2.TaskMount(kind=kind, name=name, path=path, read_only=read_only)


async def _run(
    tasks: TaskManager,
    task_id: str,
    image: str,
    script: str,
    mounts: Sequence[worker_pb2.TaskMount],
    volumes_: Sequence[worker_pb2.VolumeAccess] = (),
    disks: Sequence[worker_pb2.DiskAccess] = (),
) -> tuple[worker_pb2.TaskStatus, str]:
    """Runs the task to its end; its status as reported and its output."""
    spec = worker_pb2.TaskSpec(
        task_id=task_id, image=image, command=["sh", "-c", script], mounts=list(mounts)
    )
    await tasks.run(spec, volumes_, disks)
    await asyncio.wait_for(tasks._record(task_id).finished.wait(), 120)
    return tasks.status(task_id), tasks.output(task_id).tail()


async def _printed(tasks: TaskManager, task_id: str, word: str) -> None:
    async def printed() -> bool:
        return word in tasks.output(task_id).tail()

    await eventually(printed, 60, what=f"task {task_id} printing {word}")


def _object(s3: S3, key: str) -> bytes:
    body = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"]
    data: bytes = body.read()
    return data


async def test_a_file_written_is_an_object_at_the_end_and_the_next_task_reads_it(
    tasks: TaskManager, s3: S3, image: tuple[LocalRegistry, str], storage: TaskStorage
) -> None:
    mounts = [_mount("volume", "data", "/data")]
    status, out = await _run(
        tasks, "writes", image[1], "id -u; echo hello > /data/out.txt", mounts, [s3.access()]
    )
    assert (status.state, out) == (worker_pb2.TASK_STATE_SUCCEEDED, "1000\n"), status.reason
    # Reported ended: the object is there (the unmount waited for its upload).
    assert _object(s3, "runs/out.txt") == b"hello\n"
    assert volumes.mounts_under(storage.volumes_dir) == [], "unmounted at its end"
    status, out = await _run(tasks, "reads", image[1], "cat /data/out.txt", mounts, [s3.access()])
    assert (status.state, out) == (worker_pb2.TASK_STATE_SUCCEEDED, "hello\n"), status.reason


async def test_a_read_only_volume_refuses_writes(
    tasks: TaskManager, s3: S3, image: tuple[LocalRegistry, str]
) -> None:
    s3.client().put_object(Bucket=BUCKET, Key="runs/given.txt", Body=b"given\n")
    mounts = [_mount("volume", "data", "/data", read_only=True)]
    script = "cat /data/given.txt; echo no > /data/new.txt"
    status, out = await _run(tasks, "ro", image[1], script, mounts, [s3.access()])
    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert "given\n" in out
    assert "Read-only file system" in out, out
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="runs/new")
    assert listed["KeyCount"] == 0


async def test_one_volume_at_two_paths_one_read_only(
    tasks: TaskManager, s3: S3, image: tuple[LocalRegistry, str], storage: TaskStorage
) -> None:
    mounts = [_mount("volume", "data", "/data"), _mount("volume", "data", "/ro", read_only=True)]
    script = "echo two > /data/two.txt; echo no > /ro/no.txt; mount | grep -c ' /ro .*ro,'"
    status, out = await _run(tasks, "twice", image[1], script, mounts, [s3.access()])
    assert status.state == worker_pb2.TASK_STATE_SUCCEEDED, status.reason
    assert "Read-only file system" in out, out
    assert "1" in out.splitlines(), out  # /ro is mounted read-only
    assert _object(s3, "runs/two.txt") == b"two\n"
    assert volumes.mounts_under(storage.volumes_dir) == []


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"secret_access_key": "not-the-secret"}, "SignatureDoesNotMatch"),
        (
            {"access_key_id": "AKIANOBODY", "secret_access_key": "nobodys-secret"},
            "InvalidAccessKeyId",
        ),
        ({"bucket": "s3://no-such-bucket/runs"}, "NoSuchBucket"),
        ({"stranger": "1"}, "AccessDenied"),
        ({"endpoint": "http://127.0.0.1:9"}, "the endpoint http://127.0.0.1:9 is unreachable"),
    ],
)
async def test_a_volume_that_cannot_be_mounted_fails_the_task_at_start(
    tasks: TaskManager,
    s3: S3,
    image: tuple[LocalRegistry, str],
    storage: TaskStorage,
    changes: dict[str, str],
    error: str,
) -> None:
    if changes.pop("stranger", None):
        changes = {"access_key_id": s3.denied_key_id, "secret_access_key": s3.denied_secret}
    access = s3.access(**changes)
    mounts = [_mount("volume", "data", "/data")]
    status, _ = await _run(tasks, "refused", image[1], "echo ran", mounts, [access])
    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert status.reason.startswith(f"volume data: {error}"), status.reason
    assert status.reason.endswith(f"on {access.bucket}"), status.reason
    assert "ran" not in tasks.output("refused").tail(), "the container never started"
    assert access.secret_access_key not in status.reason
    assert volumes.mounts_under(storage.volumes_dir) == [], "nothing left mounted"


async def test_a_write_the_bucket_refuses_fails_the_task_naming_it(
    tasks: TaskManager, s3: S3, image: tuple[LocalRegistry, str], storage: TaskStorage
) -> None:
    """A key that may list but not write mounts; the task's close succeeds (rclone uploads
    after it), the upload is refused: the task does not end succeeded."""
    access = s3.access(access_key_id=s3.reader_key_id, secret_access_key=s3.reader_secret)
    mounts = [_mount("volume", "data", "/data")]
    listing_refused = "volume data: AccessDenied: Access Denied on s3://"
    for attempt in range(3):
        status, _ = await _run(
            tasks, f"refused-put-{attempt}", image[1], "echo hi > /data/put.txt", mounts, [access]
        )
        # moto under a loaded full suite once refused this key's listing (the check before the
        # mount), which it allows: that run says nothing of the upload, so it is run again.
        if not status.reason.startswith(listing_refused):
            break
    assert status.state == worker_pb2.TASK_STATE_FAILED
    if not status.reason.startswith(listing_refused):  # moto refused even the listing: still
        assert status.reason == (  # a failure naming the volume and S3's refusal (above)
            "volume data: put.txt: Failed to copy: AccessDenied: Access Denied (exited with code 0)"
        ), status.reason
    assert volumes.mounts_under(storage.volumes_dir) == []


async def test_a_mount_without_its_access_entry_is_invalid(
    tasks: TaskManager, s3: S3, image: tuple[LocalRegistry, str]
) -> None:
    spec = worker_pb2.TaskSpec(
        task_id="no-access",
        image=image[1],
        command=["true"],
        mounts=[_mount("volume", "data", "/data"), _mount("disk", "scratch", "/scratch")],
    )
    with pytest.raises(InvalidTask, match="volume data has no entry in volumes"):
        await tasks.run(spec, [], [])
    with pytest.raises(InvalidTask, match="disk scratch has no entry in disks"):
        await tasks.run(spec, [s3.access()], [])


async def test_the_credentials_reach_the_fuse_process_and_nothing_of_the_task(
    tasks: TaskManager,
    runtime: RuncRuntime,
    s3: S3,
    image: tuple[LocalRegistry, str],
    storage: TaskStorage,
    tmp_path: Path,
) -> None:
    spec = worker_pb2.TaskSpec(
        task_id="holds",
        image=image[1],
        command=["sh", "-c", "echo up; sleep 60 & sleep 60"],
        mounts=[_mount("volume", "data", "/data")],
    )
    await tasks.run(spec, [s3.access()], [])
    await _printed(tasks, "holds", "up")
    secret = s3.secret.encode()
    held = tasks._mounts["holds"]
    assert [m.volume for m in held] == [None], "the agent keeps no key once its volume is up"
    ps = await asyncio.create_subprocess_exec(
        *runtime._runc_argv("ps", "--format", "json", container_id("holds")),
        stdout=asyncio.subprocess.PIPE,
    )
    listed, _ = await ps.communicate()
    pids = json.loads(listed)
    assert len(pids) >= 2, "its two sleeps"
    for pid in pids:
        assert secret not in _read(Path(f"/proc/{pid}/environ")), f"task process {pid}"
    # Where they are: the FUSE process's environment (so the look above looked at the right
    # thing), and only there.
    fuse = _fuse_processes(storage.volumes_dir)
    assert len(fuse) == 1
    assert secret in _read(fuse[0] / "environ")
    assert secret not in _read(fuse[0] / "cmdline")
    bundle = tasks._record("holds").directory / "bundle"
    config = json.loads((bundle / "config.json").read_text())
    assert secret not in json.dumps(config).encode()
    for mount in config["mounts"]:
        source = Path(mount["source"])
        if mount["type"] != "bind" or mount["destination"] in ("/sys", "/dev", "/proc"):
            continue
        for found in _files(source):
            assert secret not in _read(found), f"{found}, bound at {mount['destination']}"
    for found in _files(tmp_path / "work"):  # the task's record, its output, its bundle
        if found.name != LAYER_FILE:  # its writable layer: 20 GiB sparse, what the task wrote
            assert secret not in _read(found), found
    await tasks.cancel("holds")
    assert volumes.mounts_under(storage.volumes_dir) == []


def _fuse_processes(under: Path) -> list[Path]:
    """/proc/PID of each rclone mounting something under `under`."""
    return [
        p
        for p in Path("/proc").glob("[0-9]*")
        if _read(p / "comm").strip() == b"rclone" and str(under).encode() in _read(p / "cmdline")
    ]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _files(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for folder, folders, names in os.walk(root):
        # Not into another file system (the task's writable layer, its root's overlay).
        folders[:] = [f for f in folders if not os.path.ismount(os.path.join(folder, f))]
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path


async def test_a_disk_is_size_limited_durable_and_one_tasks_at_a_time(
    tasks: TaskManager, image: tuple[LocalRegistry, str], storage: TaskStorage
) -> None:
    mounts = [_mount("disk", "scratch", "/scratch")]
    disk = worker_pb2.DiskAccess(name="scratch", disk_id="d-0001", size_bytes=64 * 1024**2)
    script = "echo kept > /scratch/kept; dd if=/dev/zero of=/scratch/big bs=1M count=100"
    status, out = await _run(tasks, "fills", image[1], script, mounts, disks=[disk])
    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert status.exit_code == 1
    assert "No space left on device" in out, out
    assert storage.disks is not None
    image_file = storage.disks.image("d-0001")
    assert image_file.stat().st_size == 64 * 1024**2, "the file stays, its size the cap"
    assert storage.disks.user("d-0001") == "", "unmounted at its end"
    (listed,) = storage.disks.disks()
    assert listed.used_bytes > 60 * 1024**2
    assert listed.task_id == ""
    # A later task (another user-namespace range) owns what the first wrote.
    script = "cat /scratch/kept; rm /scratch/big && echo removed; sleep 60"
    spec = worker_pb2.TaskSpec(
        task_id="reads", image=image[1], command=["sh", "-c", script], mounts=mounts
    )
    await tasks.run(spec, [], [disk])
    await _printed(tasks, "reads", "removed")
    assert tasks.output("reads").tail() == "kept\nremoved\n"
    assert storage.disks.user("d-0001") == "reads"
    second = worker_pb2.TaskSpec(task_id="second", image=image[1], command=["true"], mounts=mounts)
    with pytest.raises(DiskBusy, match="disk scratch is in use by task reads on this machine"):
        await tasks.run(second, [], [disk])
    await tasks.cancel("reads")
    assert storage.disks.user("d-0001") == ""
    assert storage.disks.delete("d-0001")
    assert not image_file.exists()


async def test_an_agent_start_sweeps_what_a_dead_agent_left_mounted(
    s3: S3, storage: TaskStorage, tmp_path: Path
) -> None:
    os.environ.pop("AWS_CA_BUNDLE", None)
    mounts = [
        StorageMount("volume", "data", "/data", volume=_access(s3)),
        StorageMount("disk", "scratch", "/scratch", disk=_disk()),
    ]
    binds = await storage.attach("left", mounts, Owner(0, 0))
    assert [volumes.mounted(b.source) for b in binds] == [True, True]
    (binds[0].source / "kept.txt").write_text("kept\n")
    swept = TaskStorage(storage.volumes_dir, DiskStore(tmp_path / "durable-disks"))
    await asyncio.to_thread(swept.sweep, ["another-task"])
    assert [volumes.mounted(b.source) for b in binds] == [False, False]
    assert _object(s3, "runs/kept.txt") == b"kept\n"


def _access(s3: S3) -> volumes.VolumeAccess:
    given = s3.access()
    return volumes.VolumeAccess(
        given.name,
        given.bucket,
        given.endpoint,
        given.region,
        given.access_key_id,
        given.secret_access_key,
    )


def _disk() -> DiskAccess:
    return DiskAccess("scratch", "d-swept", 32 * 1024**2)


@pytest.fixture
def runsc(
    image: tuple[LocalRegistry, str], tmp_path: Path, storage: TaskStorage
) -> Iterator[RunscRuntime]:
    registry, _ = image
    yield RunscRuntime(
        ImageCache(tmp_path / "images", insecure=[registry.address]),
        tmp_path / "runsc",
        dev_root=tmp_path / "dev",
        driver_root=tmp_path / "nvidia",
        limits=Limits(memory_bytes=256 * 1024**2, pids=256),
        storage=storage,
    )
    storage.sweep(keep=())


@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed")
async def test_runsc_tasks_have_volumes_through_s3fs_and_disks(
    runsc: RunscRuntime, s3: S3, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    """gVisor's gofer serves the task's mounts: a disk as runc's; a volume through s3fs (its
    file creation through rclone 1.60's mount answers EIO in this runsc)."""
    tasks = TaskManager(runsc, (), tmp_path / "work", lambda _: None)
    mounts = [_mount("volume", "data", "/data"), _mount("disk", "scratch", "/scratch")]
    disk = worker_pb2.DiskAccess(name="scratch", disk_id="d-runsc", size_bytes=32 * 1024**2)
    s3.client().put_object(Bucket=BUCKET, Key="runs/given.txt", Body=b"given\n")
    script = "cat /data/given.txt && echo gv > /data/gvisor.txt && echo dk > /scratch/d"
    status, out = await _run(tasks, "gv", image[1], script, mounts, [s3.access()], [disk])
    assert (status.state, out) == (worker_pb2.TASK_STATE_SUCCEEDED, "given\n"), status.reason
    assert status.host == "runsc"
    assert _object(s3, "runs/gvisor.txt") == b"gv\n"
    status, out = await _run(tasks, "gv2", image[1], "cat /scratch/d", mounts[1:], [], [disk])
    assert (status.state, out) == (worker_pb2.TASK_STATE_SUCCEEDED, "dk\n"), status.reason


async def test_the_controlplane_lists_and_deletes_a_machines_disks(
    tasks: TaskManager, image: tuple[LocalRegistry, str], storage: TaskStorage
) -> None:
    server = await WorkerServer.start(WorkerService(tasks, storage.disks), TOKEN, "127.0.0.1")
    bare = await WorkerServer.start(WorkerService(tasks), TOKEN, "127.0.0.1")
    channel = aio.insecure_channel(server.advertised_address)
    bare_channel = aio.insecure_channel(bare.advertised_address)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    try:
        disk = worker_pb2.DiskAccess(name="scratch", disk_id="d-listed", size_bytes=32 * 1024**2)
        spec = worker_pb2.TaskSpec(
            task_id="holds-disk",
            image=image[1],
            command=["sh", "-c", "head -c 1048576 /dev/zero > /scratch/f; echo up; sleep 60"],
            mounts=[_mount("disk", "scratch", "/scratch")],
        )
        request = worker_pb2.RunTaskRequest(task=spec, disks=[disk])
        await stub.RunTask(request, metadata=AUTH)
        await _printed(tasks, "holds-disk", "up")
        listed = await stub.ListNodeDisks(worker_pb2.ListNodeDisksRequest(), metadata=AUTH)
        (shown,) = listed.disks
        assert (shown.disk_id, shown.size_bytes, shown.task_id) == (
            "d-listed",
            32 * 1024**2,
            "holds-disk",
        )
        assert shown.used_bytes >= 1024**2
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await stub.DeleteNodeDisk(
                worker_pb2.DeleteNodeDiskRequest(disk_id="d-listed"), metadata=AUTH
            )
        assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "in use by task holds-disk" in (busy.value.details() or "")
        await tasks.cancel("holds-disk")
        (shown,) = (
            await stub.ListNodeDisks(worker_pb2.ListNodeDisksRequest(), metadata=AUTH)
        ).disks
        assert shown.task_id == ""
        assert shown.used_bytes >= 1024**2, "read from the unmounted file"
        for deleted in (True, False):
            answer = await stub.DeleteNodeDisk(
                worker_pb2.DeleteNodeDiskRequest(disk_id="d-listed"), metadata=AUTH
            )
            assert answer.deleted is deleted
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.DeleteNodeDisk(
                worker_pb2.DeleteNodeDiskRequest(disk_id="../x"), metadata=AUTH
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        bare_stub = worker_pb2_grpc.WorkerServiceStub(bare_channel)
        none = await bare_stub.ListNodeDisks(worker_pb2.ListNodeDisksRequest(), metadata=AUTH)
        assert list(none.disks) == []
        with pytest.raises(grpc.aio.AioRpcError) as no_disks:
            await bare_stub.DeleteNodeDisk(
                worker_pb2.DeleteNodeDiskRequest(disk_id="d-listed"), metadata=AUTH
            )
        assert no_disks.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "durableDisksPath" in (no_disks.value.details() or "")
    finally:
        await channel.close()
        await bare_channel.close()
        await server.stop(0)
        await bare.stop(0)


async def test_a_volume_without_a_key_is_anonymous_never_the_agents_own(
    tasks: TaskManager,
    s3: S3,
    image: tuple[LocalRegistry, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The agent's own environment holds a key that could list the bucket (a node's role, say):
    # a volume given no key must not borrow it.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    access = s3.access(access_key_id="", secret_access_key="")
    mounts = [_mount("volume", "data", "/data")]
    status, _ = await _run(tasks, "anonymous", image[1], "echo ran", mounts, [access])
    assert status.state == worker_pb2.TASK_STATE_FAILED
    # moto, checking credentials, answers an unsigned request 500 (S3 would say AccessDenied):
    # either way it was refused, which the agent's own key would not have been.
    assert status.reason.startswith("volume data: "), status.reason
    assert status.reason.endswith("on s3://workspace-a/runs"), status.reason
    assert "ran" not in tasks.output("anonymous").tail()


async def test_a_disk_given_a_larger_size_grows_and_keeps_its_data(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "durable-disks")
    small = DiskAccess("scratch", "d-grows", 16 * 1024**2)
    point = await store.attach(small, "first", Owner(0, 0))
    (point / "kept").write_text("kept\n")
    before = os.statvfs(point)
    store.detach("d-grows")
    point = await store.attach(
        DiskAccess("scratch", "d-grows", 64 * 1024**2), "second", Owner(0, 0)
    )
    try:
        assert (point / "kept").read_text() == "kept\n"
        after = os.statvfs(point)
        assert after.f_blocks * after.f_frsize > 3 * before.f_blocks * before.f_frsize
        assert store.image("d-grows").stat().st_size == 64 * 1024**2
    finally:
        store.detach("d-grows")
    # A smaller size later is not a shrink: the disk keeps its room.
    point = await store.attach(small, "third", Owner(0, 0))
    store.detach("d-grows")
    assert store.image("d-grows").stat().st_size == 64 * 1024**2
