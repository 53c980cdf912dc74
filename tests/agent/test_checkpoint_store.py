"""Checkpoint images kept in a workspace's volume (levers9.agent.checkpoints.upload/download),
against moto checking credentials: a sealed image is uploaded as `<prefix>/checkpoints/<name>/`
image.tar + image.tar.sha256 and fetched whole into another machine's checkpoints root (every
file, a symlink and an overlay's whiteout as they were, the manifest verified); a tar changed in
the bucket is refused naming the checksum and nothing is left behind; a checkpoint the volume
lacks is named; an image.tar replaced with a matching image.tar.sha256 (the workspace may write
its bucket) is refused against the sha256 the upload answered; an upload a key may not make
fails naming the volume and S3's error, never the key. With the real runsc (root): a counting
task checkpointed by one TaskManager with its checkpoint volume is restored by another, whose
checkpoints root never held the image, and counts on from where it was; a third, given the
same image changed in the bucket, fails the restore naming the checksum and restores nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

import pytest

from levers9.agent import checkpoints
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.supervisor import TaskManager, store_access
from levers9.proto import worker_pb2
from sandbox.registries import LocalRegistry
from tests.agent.conftest import BUCKET, S3
from tests.agent.test_checkpoints import _runtime
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an image's whiteouts need root")

COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; echo $i > /work/layer-count;"
    " echo $i; sleep 0.2; done"
)


def _image(root: Path, name: str = "box-1") -> Path:
    """A sealed image as a checkpoint leaves it: runsc's state, a writable layer with a file,
    a symlink and a whiteout (a 0:0 character device)."""
    path = checkpoints.image_path(root, "team-a", name)
    folder = checkpoints.staging(path)
    (folder / checkpoints.STATE).mkdir()
    (folder / checkpoints.STATE / "checkpoint.img").write_bytes(os.urandom(1 << 20))
    work = folder / checkpoints.LAYER / "work"
    work.mkdir(parents=True)
    (work / "count").write_text("41\n")
    (work / "link").symlink_to("count")
    os.mknod(work / "gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    checkpoints.seal(folder, path, {"runtime": "runsc", "task_id": "t-1"})
    return path


async def _ended(tasks: TaskManager, task_id: str) -> worker_pb2.TaskStatus:
    """Its status once it has ended (RunTask answers once its start is under way)."""

    async def ended() -> bool:
        return tasks.status(task_id).state != worker_pb2.TASK_STATE_RUNNING

    await eventually(ended, 60, what=f"{task_id} ends")
    return tasks.status(task_id)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_an_uploaded_image_is_fetched_whole_on_another_machine(s3: S3, tmp_path: Path) -> None:
    access = store_access(s3.access("ckpt"))
    taken = _image(tmp_path / "a")
    stored, digest = checkpoints.upload(taken, access)
    assert stored == f"s3://{BUCKET}/runs/checkpoints/box-1/"
    sums = s3.client().get_object(Bucket=BUCKET, Key="runs/checkpoints/box-1/image.tar.sha256")
    assert sums["Body"].read().decode() == f"{digest}  image.tar\n"
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "runs/checkpoints/box-1/image.tar" in keys
    assert "runs/checkpoints/box-1/image.tar.sha256" in keys
    assert _leftovers(taken.parent) == [], "the upload's tar is removed"

    fetched = checkpoints.image_path(tmp_path / "b", "team-a", "box-1")
    size = checkpoints.download(access, fetched, digest)
    assert size > 1 << 20
    assert checkpoints.verify(fetched)["task_id"] == "t-1"
    for relative in ("state/checkpoint.img", "layer/work/count", "manifest.json"):
        assert (fetched / relative).read_bytes() == (taken / relative).read_bytes()
    work = fetched / "layer" / "work"
    assert os.readlink(work / "link") == "count"
    assert stat.S_ISCHR((work / "gone").lstat().st_mode)
    assert _leftovers(fetched.parent) == []


def test_a_tar_changed_in_the_bucket_is_refused_and_nothing_is_left(s3: S3, tmp_path: Path) -> None:
    access = store_access(s3.access("ckpt"))
    checkpoints.upload(_image(tmp_path / "a", "box-2"), access)
    key = "runs/checkpoints/box-2/image.tar"
    body = bytearray(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    fetched = checkpoints.image_path(tmp_path / "b", "team-a", "box-2")
    with pytest.raises(checkpoints.ImageInvalid) as refused:
        checkpoints.download(access, fetched)
    said = str(refused.value)
    assert "checkpoint box-2 in volume ckpt (s3://workspace-a/runs/checkpoints/box-2/)" in said
    assert "image.tar does not match its image.tar.sha256 (corrupted" in said
    assert "not restored" in said
    assert not fetched.exists()
    assert _leftovers(fetched.parent) == []


def test_an_image_replaced_in_the_bucket_with_its_checksum_is_refused(
    s3: S3, tmp_path: Path
) -> None:
    """The workspace may write its bucket: an image.tar replaced together with a matching
    image.tar.sha256 is refused against the sha256 the upload answered (the controlplane's)."""
    access = store_access(s3.access("ckpt"))
    _, digest = checkpoints.upload(_image(tmp_path / "a", "box-4"), access)
    other = _image(tmp_path / "other", "box-4")
    checkpoints.upload(other, access)  # a consistent pair, not the checkpoint's image
    fetched = checkpoints.image_path(tmp_path / "b", "team-a", "box-4")
    with pytest.raises(checkpoints.ImageInvalid) as refused:
        checkpoints.download(access, fetched, digest)
    said = str(refused.value)
    assert "image.tar is not the image its checkpoint uploaded" in said, said
    assert f"recorded {digest}: changed in the bucket since); not restored" in said, said
    assert not fetched.exists()
    assert _leftovers(fetched.parent) == []


def test_a_checkpoint_the_volume_lacks_is_named(s3: S3, tmp_path: Path) -> None:
    fetched = checkpoints.image_path(tmp_path, "team-a", "nope")
    with pytest.raises(checkpoints.ImageInvalid) as refused:
        checkpoints.download(store_access(s3.access("ckpt")), fetched)
    assert str(refused.value) == (
        "no checkpoint nope in volume ckpt (s3://workspace-a/runs/checkpoints/nope/)"
    )
    assert not fetched.exists()


def test_a_refused_upload_names_the_volume_and_s3_s_error_never_the_key(
    s3: S3, tmp_path: Path
) -> None:
    reader = s3.access("ckpt", access_key_id=s3.reader_key_id, secret_access_key=s3.reader_secret)
    taken = _image(tmp_path, "box-3")
    with pytest.raises(checkpoints.StoreFailed) as refused:
        checkpoints.upload(taken, store_access(reader))
    said = str(refused.value)
    assert said.startswith("checkpoint box-3: its upload to volume ckpt"), said
    assert "AccessDenied" in said, said
    assert s3.reader_secret not in said
    assert s3.reader_key_id not in said
    assert checkpoints.verify(taken)["task_id"] == "t-1", "the local image stays"
    assert _leftovers(taken.parent) == []


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("runsc") is None, reason="deploy/dev/install-tools.sh")
async def test_a_task_checkpointed_on_one_machine_is_restored_on_another(
    s3: S3, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    """TaskManager A (what CheckpointTask calls) uploads the image to the checkpoint volume;
    TaskManager B, whose checkpoints root never held it, fetches it for restore_from and the
    counter goes on. B without the volume fails saying the image is not on this machine."""
    store = s3.access("ckpt", bucket=f"s3://{BUCKET}/moving")
    reports: list[worker_pb2.TaskStatus] = []
    machine_a = TaskManager(
        _runtime(RunscRuntime, image, tmp_path / "a"),
        (),
        tmp_path / "a" / "agent",
        reports.append,
        checkpoints_root=tmp_path / "a" / "ck",
    )
    machine_b = TaskManager(
        _runtime(RunscRuntime, image, tmp_path / "b"),
        (),
        tmp_path / "b" / "agent",
        reports.append,
        checkpoints_root=tmp_path / "b" / "ck",
    )

    async def counted_past(tasks: TaskManager, task_id: str, above: int) -> int:
        seen = 0

        async def check() -> bool:
            nonlocal seen
            said = bytes(tasks.output(task_id).read(0, 1 << 20)).split()
            seen = int(said[-1]) if said and said[-1].isdigit() else 0
            return seen > above

        await eventually(check, 60, what=f"{task_id} counts past {above}")
        return seen

    first = f"m1-{uuid.uuid4().hex[:8]}"
    spec = worker_pb2.TaskSpec(
        task_id=first,
        image=image[1],
        command=["sh", "-c", COUNTER],
        workspace="team-a",
        checkpoint_volume="ckpt",
    )
    await machine_a.run(spec)
    await counted_past(machine_a, first, 3)
    answer = await machine_a.checkpoint(first, "moved-1", store_access(store))
    assert len(answer.stored_sha256) == 64
    assert (answer.stored, answer.store_error) == (
        f"s3://{BUCKET}/moving/checkpoints/moved-1/",
        "",
    )
    before = int((Path(answer.path) / "layer" / "work" / "layer-count").read_text())

    restore = worker_pb2.TaskSpec(
        task_id=f"m2-{uuid.uuid4().hex[:8]}",
        image=image[1],
        command=["sh", "-c", COUNTER],
        workspace="team-a",
        restore_from="moved-1",
        restore_sha256=answer.stored_sha256,
    )
    lacking = worker_pb2.TaskSpec()
    lacking.CopyFrom(restore)
    lacking.task_id = f"m3-{uuid.uuid4().hex[:8]}"
    await machine_b.run(lacking)  # no checkpoint volume: only what this machine holds
    status = await _ended(machine_b, lacking.task_id)
    assert status.state == worker_pb2.TASK_STATE_FAILED, status
    assert "no checkpoint moved-1 on this machine" in status.reason

    await machine_b.run(restore, checkpoint_store=store)
    try:
        assert await counted_past(machine_b, restore.task_id, before) > before
        first_printed = int(bytes(machine_b.output(restore.task_id).read(0, 1 << 20)).split()[0])
        assert first_printed > before - 2, "it went on from where it was, not from 1"
        assert (tmp_path / "b" / "ck" / "team-a" / "moved-1" / "manifest.json").is_file()
    finally:
        await machine_b.cancel(restore.task_id)
        await machine_b.shutdown(grace_s=1)
        await machine_a.shutdown(grace_s=1)

    # The same image changed in the bucket: a third machine refuses it, restoring nothing.
    key = "moving/checkpoints/moved-1/image.tar"
    body = bytearray(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[-4096] ^= 0xFF
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    machine_c = TaskManager(
        _runtime(RunscRuntime, image, tmp_path / "c"),
        (),
        tmp_path / "c" / "agent",
        reports.append,
        checkpoints_root=tmp_path / "c" / "ck",
    )
    corrupted = worker_pb2.TaskSpec()
    corrupted.CopyFrom(restore)
    corrupted.task_id = f"m4-{uuid.uuid4().hex[:8]}"
    await machine_c.run(corrupted, checkpoint_store=store)
    status = await _ended(machine_c, corrupted.task_id)
    assert status.state == worker_pb2.TASK_STATE_FAILED, status
    assert "image.tar does not match its image.tar.sha256 (corrupted" in status.reason
    assert status.reason.startswith("restore_from: checkpoint moved-1 in volume ckpt")
    assert not (tmp_path / "c" / "ck" / "team-a" / "moved-1").exists()
    await machine_c.shutdown(grace_s=1)
