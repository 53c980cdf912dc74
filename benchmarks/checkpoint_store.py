"""A checkpoint image kept in a volume: upload and download of an N MiB image against a moto S3
server started here (loopback), through the agent's own functions
(levers9.agent.checkpoints.upload: tar of the image's folder, its sha256, boto3's multipart
upload, the sha256 object; download: the sha256 object, the tar, its sha256 checked, untar,
every file's manifest checksum verified, rename). The image is what a checkpoint seals: a
`state/` file of N MiB of /dev/urandom (incompressible, as a sandbox's memory is) and a small
writable layer. Prints, per size, the medians (and maxima) of upload and download seconds and
their MiB/s. Not part of `make test`; root (an image's whiteouts are devices).

    sudo .venv/bin/python -m benchmarks.checkpoint_store --sizes 100 --runs 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import stat
import statistics
import tempfile
import time
from pathlib import Path

import boto3

from levers9.agent import checkpoints
from levers9.agent.volumes import VolumeAccess
from sandbox import aws
from sandbox.aws import LocalMoto

BUCKET = "bench-checkpoints"


def _image(root: Path, name: str, mib: int) -> Path:
    path = checkpoints.image_path(root, "bench", name)
    folder = checkpoints.staging(path)
    (folder / checkpoints.STATE).mkdir()
    with (folder / checkpoints.STATE / "checkpoint.img").open("wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))
    work = folder / checkpoints.LAYER / "work"
    work.mkdir(parents=True)
    (work / "count").write_text("41\n")
    os.mknod(work / "gone", stat.S_IFCHR, os.makedev(0, 0))
    checkpoints.seal(folder, path, {"runtime": "runsc", "task_id": name})
    return path


def _line(label: str, values: list[float], mib: int) -> str:
    median = statistics.median(values)
    return f"{label}: {median:.2f} s ({max(values):.2f}), {mib / median:.0f} MiB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100", help="MiB, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.machine()}, nproc={os.cpu_count()}, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
        work = Path(scratch)
        moto = LocalMoto(work / "moto.log").start()
        try:
            boto3.client(
                "s3",
                endpoint_url=moto.endpoint,
                region_name=aws.REGION,
                aws_access_key_id=aws.ACCESS_KEY_ID,
                aws_secret_access_key=aws.SECRET_ACCESS_KEY,
            ).create_bucket(Bucket=BUCKET)
            access = VolumeAccess(
                name="ckpt",
                bucket=f"s3://{BUCKET}/team",
                endpoint=moto.endpoint,
                region=aws.REGION,
                access_key_id=aws.ACCESS_KEY_ID,
                secret_access_key=aws.SECRET_ACCESS_KEY,
            )
            for mib in (int(s) for s in args.sizes.split(",")):
                ups, downs = [], []
                for run in range(args.runs):
                    name = f"img-{mib}-{run}"
                    taken = _image(work / "a", name, mib)
                    started = time.monotonic()
                    _, digest = checkpoints.upload(taken, access)
                    ups.append(time.monotonic() - started)
                    target = checkpoints.image_path(work / "b", "bench", name)
                    started = time.monotonic()
                    size = checkpoints.download(access, target, digest)
                    downs.append(time.monotonic() - started)
                    shutil.rmtree(taken)
                    shutil.rmtree(target)
                print(f"{mib} MiB image (tar {size / 2**20:.1f} MiB)")
                print("  " + _line("upload (tar, sha256, put)", ups, mib))
                print("  " + _line("download (get, sha256, untar, verify)", downs, mib))
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
