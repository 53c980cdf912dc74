"""A task's storage against what it stands on (root; issue 38).

Volumes: a sequential write then a cold read of one file of `--mib` MiB through a volume
mounted as the agent mounts it (levers9.agent.volumes.mount: s3fs and rclone, each measured),
against the same bucket written and read with boto3 directly, on a moto S3 server started here.
The read is cold: the volume is unmounted and mounted again between the write and the read (no
page cache of the FUSE mount survives). Each figure is the median of `--runs`.

Disks: the same sequential write (fsync'd) and cold read (after `echo 3 > drop_caches`, or a
remount) of a file on a durable disk (levers9.agent.disks: an ext4 image loop-mounted) against
the node's own disk (the folder the image lives in).

    sudo .venv/bin/python benchmarks/storage.py [--mib 256] [--runs 3] [--backends s3fs,rclone]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from levers9.agent import disks, volumes  # noqa: E402
from sandbox.aws import LocalMoto  # noqa: E402

CHUNK = 1024 * 1024
KEY_ID, SECRET = "bench", "bench-secret"


def _write(path: Path, mib: int, sync: bool = False) -> None:
    block = os.urandom(CHUNK)
    with path.open("wb") as out:
        for _ in range(mib):
            out.write(block)
        if sync:
            out.flush()
            os.fsync(out.fileno())


def _read(path: Path) -> int:
    total = 0
    with path.open("rb", buffering=0) as src:
        while chunk := src.read(CHUNK):
            total += len(chunk)
    return total


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class _Stream:
    """`mib` MiB of one random block repeated, as a file object boto3 reads."""

    def __init__(self, mib: int) -> None:
        self.left = mib * CHUNK
        self.block = os.urandom(CHUNK)

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        whole, part = divmod(size, CHUNK)
        return self.block * whole + self.block[:part]


def _check_size(endpoint: str, bucket: str, key: str, mib: int) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    if size != mib * CHUNK:
        raise SystemExit(f"s3://{bucket}/{key} holds {size} bytes, not {mib * CHUNK}")


def _direct(endpoint: str, bucket: str, mib: int) -> tuple[float, float]:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )
    key = "direct.bin"
    write = _timed(lambda: client.upload_fileobj(_Stream(mib), bucket, key))
    _check_size(endpoint, bucket, key, mib)

    def read() -> None:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        while body.read(CHUNK):
            pass

    return write, _timed(read)


def _volume(endpoint: str, bucket: str, mib: int, backend: str, work: Path) -> tuple[float, float]:
    access = volumes.VolumeAccess(
        name="bench",
        bucket=f"s3://{bucket}/{backend}",
        endpoint=endpoint,
        access_key_id=KEY_ID,
        secret_access_key=SECRET,
    )
    target = work / backend / "data"
    owner = volumes.Owner(0, 0)

    async def mounted() -> None:
        await volumes.mount(access, target, owner, False, backend=backend)

    asyncio.run(mounted())
    # The write is done once the object is in the bucket: its unmount (its last upload) counts.
    started = time.perf_counter()
    try:
        _write(target / "file.bin", mib)
    finally:
        volumes.unmount(target)
    write = time.perf_counter() - started
    _check_size(endpoint, bucket, f"{backend}/file.bin", mib)
    asyncio.run(mounted())
    try:
        read = _timed(lambda: _read(target / "file.bin"))
    finally:
        volumes.unmount(target)
    return write, read


def _drop_caches() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _disk(work: Path, mib: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((disk write, disk read), (node write, node read)) in seconds."""
    node = work / "node"
    node.mkdir(parents=True, exist_ok=True)
    store = disks.DiskStore(work / "images", work / "points")
    access = disks.DiskAccess(name="bench", disk_id="bench", size_bytes=(mib + 256) * CHUNK)
    point = asyncio.run(store.attach(access, "bench-task", disks.Owner(0, 0)))
    try:
        disk_write = _timed(lambda: _write(point / "file.bin", mib, sync=True))
        _drop_caches()
        disk_read = _timed(lambda: _read(point / "file.bin"))
    finally:
        store.detach(access.disk_id)
    node_write = _timed(lambda: _write(node / "file.bin", mib, sync=True))
    _drop_caches()
    node_read = _timed(lambda: _read(node / "file.bin"))
    return (disk_write, disk_read), (node_write, node_read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backends", default=",".join(volumes.BACKENDS))
    parser.add_argument("--disks-only", action="store_true", help="skip the volumes")
    args = parser.parse_args()
    os.environ.pop("AWS_CA_BUNDLE", None)  # rclone fails to load this environment's
    print(f"nproc={os.cpu_count()} {platform.processor() or platform.machine()} {args.mib} MiB")
    with tempfile.TemporaryDirectory(prefix="l9-storage-") as scratch:
        work = Path(scratch)
        moto = LocalMoto(work / "moto.log").start()
        try:
            boto3.client(
                "s3",
                endpoint_url=moto.endpoint,
                region_name="us-east-1",
                aws_access_key_id=KEY_ID,
                aws_secret_access_key=SECRET,
            ).create_bucket(Bucket="bench")
            results: dict[str, list[tuple[float, float]]] = {"boto3 direct": []}
            for backend in args.backends.split(","):
                results[f"volume ({backend})"] = []
            for _ in range(0 if args.disks_only else args.runs):
                results["boto3 direct"].append(_direct(moto.endpoint, "bench", args.mib))
                for backend in args.backends.split(","):
                    results[f"volume ({backend})"].append(
                        _volume(moto.endpoint, "bench", args.mib, backend, work)
                    )
        finally:
            moto.stop()
        disk_runs = [_disk(work / f"disk{i}", args.mib) for i in range(args.runs)]
    _volumes_table(results, args.mib)
    _disks_table(disk_runs, args.mib)


def _volumes_table(results: dict[str, list[tuple[float, float]]], mib: int) -> None:
    if not results["boto3 direct"]:
        return
    direct_w = statistics.median(w for w, _ in results["boto3 direct"])
    direct_r = statistics.median(r for _, r in results["boto3 direct"])
    print("| path | write MiB/s | read MiB/s | write vs direct | read vs direct |")
    print("| - | - | - | - | - |")
    for name, runs in results.items():
        w = statistics.median(x for x, _ in runs)
        r = statistics.median(y for _, y in runs)
        print(
            f"| {name} | {mib / w:.0f} | {mib / r:.0f} | {direct_w / w:.0%} | {direct_r / r:.0%} |"
        )


def _disks_table(
    disk_runs: list[tuple[tuple[float, float], tuple[float, float]]], mib: int
) -> None:
    dw = statistics.median(d[0][0] for d in disk_runs)
    dr = statistics.median(d[0][1] for d in disk_runs)
    nw = statistics.median(d[1][0] for d in disk_runs)
    nr = statistics.median(d[1][1] for d in disk_runs)
    print("| disk | write MiB/s | read MiB/s | write vs node | read vs node |")
    print("| - | - | - | - | - |")
    print(f"| node's own disk | {mib / nw:.0f} | {mib / nr:.0f} | 100% | 100% |")
    print(
        f"| durable disk (ext4 on loop, direct I/O) | {mib / dw:.0f} | {mib / dr:.0f} |"
        f" {nw / dw:.0%} | {nr / dr:.0%} |"
    )


if __name__ == "__main__":
    main()
