"""Checkpoint images of tasks: what this machine can checkpoint with, and an image on disk.

(levers9.agent.checkpoint is the kubelet's device-plugin checkpoint, unrelated.)

What the agent can checkpoint with is read once at its start (`detect`) and reported to the
gateway with its registration (`Capability.summary`: `runsc`, or `none (...)` saying why):

- gVisor's `runsc checkpoint` / `runsc restore`, for tasks of the `runsc` runtime (the only
  path that works on this kernel);
- CRIU (`criu check`), which runc's checkpoint needs: on kernel 6.18 `criu check` fails (its
  vDSO check), and the failure is reported verbatim; runc tasks are refused, never half-dumped;
- NVIDIA's `cuda-checkpoint` (or the driver's `cuCheckpointProcess*` API in libcuda), which a
  GPU task needs before its process can be dumped: without it a GPU task is refused.

An image is a folder `<root>/<workspace>/<name>` (root: the worker's durableDisksPath's
`checkpoints/`, else its work dir's): `state/` (runsc's image), `layer/` (a copy of the task's
writable layer), `checkpoint.json` (what it was taken of: the task, its image's digest, the
runtime) and `manifest.json` (sha256 and size of every other file). It is written in a staging
folder beside it, every file fsynced, then renamed into place (`seal`): a failed checkpoint
leaves no image, a half-written one is never found under the name. A restore verifies every
checksum first (`verify`).

A task with a checkpoint volume (TaskSpec.checkpoint_volume: `box create --checkpoints V`) has
its sealed image also uploaded to that volume's bucket with the workspace's credentials
(`upload`): `<prefix>/checkpoints/<name>/image.tar` (a tar of the image's folder, owners,
modes, xattrs and an overlay's whiteouts kept) then `image.tar.sha256`, written last so that an
image whose checksum is there is whole. A restore on a machine that lacks the image fetches both
(`download`), refuses a tar whose sha256 is not the one stored (never restoring a corrupted
image), unpacks it in a staging folder, verifies every file against its manifest, and renames
it into place: from then on it is restored as a local image.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.agent.volumes import VolumeAccess
from levers9.contract import CHECKPOINT_STORE_FOLDER
from levers9.core.workspaces import name_problem

STATE = "state"
"""The runtime's own image of the sandbox (runsc's `--image-path`)."""
LAYER = "layer"
"""A copy of the task's writable layer (the overlay's upper folder)."""
META = "checkpoint.json"
MANIFEST = "manifest.json"
FORMAT = 1
CHECK_TIMEOUT_S = 20.0
STORE_FOLDER = CHECKPOINT_STORE_FOLDER
"""Under a checkpoint volume's prefix: one folder per checkpoint name."""
TAR = "image.tar"
TAR_SUM = "image.tar.sha256"
STORE_TIMEOUT_S = 60.0
"""Connect and read timeouts of one S3 call (a part of an upload, say)."""
CUDA_SYMBOL = "cuCheckpointProcessLock"
"""The driver's checkpoint API (driver 550+): what `cuda-checkpoint` calls."""


class CheckpointRefused(RuntimeError):
    """The task cannot be checkpointed here (its runtime, its cards, its state): nothing was
    written and it runs on. The message says why."""


class CheckpointFailed(RuntimeError):
    """The checkpoint was tried and failed; the message says whether the task runs on."""


class StoreFailed(RuntimeError):
    """A checkpoint volume could not be written or read (S3's error, the volume named; never
    its credentials)."""


class ImageInvalid(ValueError):
    """A checkpoint image that cannot be restored (missing, corrupted, of another runtime or
    image): the message names the file or the field."""


@dataclass(frozen=True)
class Capability:
    """What this machine can checkpoint with; each field "" when usable, else why not."""

    runsc: str
    criu: str
    cuda: str

    def summary(self) -> str:
        """`runsc` (with `+cuda` when GPU tasks can be too), or `none (...)` naming why."""
        if not self.runsc:
            return "runsc+cuda" if not self.cuda else "runsc"
        if not self.criu:
            return "criu"
        return f"none (runsc: {self.runsc}; criu check: {self.criu})"

    def detail(self) -> dict[str, str]:
        return {
            "runsc": self.runsc or "ok",
            "criu": self.criu or "ok",
            "cuda": self.cuda or "ok",
        }


async def probe(*argv: str) -> tuple[int, str]:
    """(exit status, its output's last line) of `argv`; 127 when it is not installed."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except FileNotFoundError:
        return 127, f"{argv[0]} is not installed"
    try:
        out, _ = await asyncio.wait_for(process.communicate(), CHECK_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return 124, f"{' '.join(argv)} did not answer within {CHECK_TIMEOUT_S:g} s"
    lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
    return process.returncode or 0, (lines[-1] if lines else "")


async def detect(
    runsc: str = "runsc", criu: str = "criu", driver_lib_dirs: tuple[Path, ...] = ()
) -> Capability:
    """What this machine can checkpoint with (see the module's docstring)."""
    code, said = await probe(runsc, "help", "checkpoint")
    runsc_problem = "" if code == 0 else (said or f"runsc help checkpoint exited {code}")
    code, said = await probe(criu, "check")
    criu_problem = "" if code == 0 else (said or f"criu check exited {code}")
    return Capability(runsc_problem, criu_problem, cuda_problem(driver_lib_dirs))


def cuda_problem(lib_dirs: tuple[Path, ...] = ()) -> str:
    """ "" when a GPU task's CUDA state can be checkpointed here (`cuda-checkpoint` installed, or
    libcuda exporting the driver's checkpoint API), else why not."""
    if shutil.which("cuda-checkpoint") is not None:
        return ""
    candidates = [d / "libcuda.so.1" for d in lib_dirs] + [Path("libcuda.so.1")]
    for candidate in candidates:
        if candidate.is_absolute() and not candidate.exists():
            continue
        try:
            library = ctypes.CDLL(str(candidate))
        except OSError:
            continue
        if hasattr(library, CUDA_SYMBOL):
            return ""
        return f"the driver's libcuda has no {CUDA_SYMBOL} (driver 550 or later has)"
    return "no cuda-checkpoint and no NVIDIA driver (libcuda.so.1) on this machine"


def image_path(root: Path, workspace: str, name: str) -> Path:
    """Where the workspace's checkpoint `name` is; ImageInvalid when either is not a DNS label."""
    for field, value in (("workspace", workspace), ("checkpoint name", name)):
        problem = name_problem(value)
        if problem is not None:
            raise ImageInvalid(f"{field} {problem}")
    return root / workspace / name


def staging(path: Path) -> Path:
    """A fresh staging folder beside `path` (same filesystem, so the rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def discard(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def delete(path: Path) -> bool:
    """Removes the image at `path` (False: there was none): renamed aside first, so that no
    half-removed image is ever found under its name."""
    if not path.is_dir():
        return False
    aside = path.parent / f".{path.name}.deleting-{uuid.uuid4().hex[:8]}"
    try:
        path.rename(aside)
    except FileNotFoundError:  # another delete took it meanwhile
        return False
    _fsync(path.parent)
    discard(aside)
    return True


def _files(folder: Path) -> list[Path]:
    """Every regular file under `folder` but the manifest, sorted (links and devices are
    kept as they are and not hashed: an overlay's whiteouts are character devices)."""
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(4 * 1024**2):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def seal(folder: Path, path: Path, meta: dict[str, Any]) -> int:
    """Writes `meta` and the manifest into the staging `folder`, fsyncs every file and folder,
    and renames it to `path`; returns the image's size in bytes. FileExistsError when `path`
    exists (the staging folder is then removed)."""
    (folder / META).write_text(json.dumps({"format": FORMAT, **meta}, sort_keys=True))
    files = {}
    total = 0
    for file in _files(folder):
        size = file.stat().st_size
        files[str(file.relative_to(folder))] = {"sha256": _sha256(file), "size": size}
        total += size
        _fsync(file)
    (folder / MANIFEST).write_text(json.dumps({"files": files}, sort_keys=True))
    _fsync(folder / MANIFEST)
    for sub in sorted({p.parent for p in folder.rglob("*")} | {folder}, reverse=True):
        if sub.is_dir() and not sub.is_symlink():
            _fsync(sub)
    try:
        if path.exists():
            raise FileExistsError(f"checkpoint {path.name} exists: delete it or take another name")
        folder.rename(path)
    except BaseException:
        discard(folder)
        raise
    _fsync(path.parent)
    return total


def verify(path: Path, shown_as: str = "") -> dict[str, Any]:
    """The image's checkpoint.json once every file's checksum is as its manifest says;
    ImageInvalid naming the first file that is missing, extra or changed (the image named
    `shown_as`, else its folder's name)."""
    label = shown_as or path.name
    if not path.is_dir():
        raise ImageInvalid(f"no checkpoint {label} on this machine ({path})")
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError) as error:
        raise ImageInvalid(f"checkpoint {label}: unreadable {MANIFEST} ({error})") from None
    found = {str(p.relative_to(path)) for p in _files(path)}
    for missing in sorted(set(manifest) - found):
        raise ImageInvalid(f"checkpoint {label}: {missing} is missing")
    for extra in sorted(found - set(manifest)):
        raise ImageInvalid(f"checkpoint {label}: {extra} is not in its manifest")
    for name, want in sorted(manifest.items()):
        if _sha256(path / name) != want["sha256"]:
            raise ImageInvalid(
                f"checkpoint {label}: {name} does not match its checksum (corrupted)"
            )
    meta: dict[str, Any] = json.loads((path / META).read_text())
    if meta.get("format") != FORMAT:
        raise ImageInvalid(f"checkpoint {label}: format {meta.get('format')} unknown")
    return meta


def store_url(access: VolumeAccess, name: str) -> str:
    """Where checkpoint `name` is kept in the volume (as messages name it)."""
    return f"{access.url}/{STORE_FOLDER}/{name}/"


def _key(access: VolumeAccess, name: str, file: str) -> str:
    return "/".join(p for p in (access.prefix, STORE_FOLDER, name, file) if p)


def _s3(access: VolumeAccess) -> Any:
    """An S3 client with the volume's own credentials (never the agent's: none means
    anonymous)."""
    import boto3
    import botocore
    import botocore.config

    config = botocore.config.Config(
        connect_timeout=STORE_TIMEOUT_S,
        read_timeout=STORE_TIMEOUT_S,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"},
        signature_version=None if access.access_key_id else botocore.UNSIGNED,
    )
    return boto3.session.Session(
        aws_access_key_id=access.access_key_id or None,
        aws_secret_access_key=access.secret_access_key or None,
    ).client(
        "s3",
        endpoint_url=access.endpoint_url,
        region_name=access.region or "us-east-1",
        config=config,
    )


def _s3_error(error: BaseException) -> tuple[str, str]:
    """(S3's code, `code: message`) of a failed call; never a credential (S3's answer and
    botocore's class name only). boto3's transfers wrap S3's answer (S3UploadFailedError):
    the answer it wraps is taken."""
    import botocore.exceptions

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, botocore.exceptions.ClientError):
            answer = cause.response.get("Error", {})
            code = str(answer.get("Code") or "error")
            message = str(answer.get("Message") or "").strip()
            return code, (f"{code}: {message}" if message and message != code else code)
        if isinstance(cause, botocore.exceptions.EndpointConnectionError):
            return "unreachable", "its endpoint is unreachable"
        cause = cause.__cause__ or cause.__context__
    return type(error).__name__, type(error).__name__


def _tar(argv: list[str]) -> None:
    import subprocess

    done = subprocess.run(["tar", *argv], capture_output=True, check=False)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise CheckpointFailed(f"tar {argv[0]}: {said[-1] if said else done.returncode}")


def upload(path: Path, access: VolumeAccess) -> tuple[str, str]:
    """Uploads the sealed image at `path` to the checkpoint volume (`image.tar`, then
    `image.tar.sha256`); where it is kept and the tar's sha256 (which the controlplane keeps,
    for `download`'s `expected`). StoreFailed naming the volume and S3's error."""
    name = path.name
    tar = path.parent / f".{name}.upload-{uuid.uuid4().hex[:8]}.tar"
    try:
        _tar(["--create", f"--file={tar}", f"--directory={path}", "--numeric-owner",
              "--xattrs", "--sparse", "."])  # fmt: skip
        digest = _sha256(tar)
        client = _s3(access)
        try:
            client.upload_file(str(tar), access.bucket_name, _key(access, name, TAR))
            client.put_object(
                Bucket=access.bucket_name,
                Key=_key(access, name, TAR_SUM),
                Body=f"{digest}  {TAR}\n".encode(),
            )
        except Exception as error:
            raise StoreFailed(
                f"checkpoint {name}: its upload to volume {access.name}"
                f" ({store_url(access, name)}) failed: {_s3_error(error)[1]}"
            ) from None
        finally:
            client.close()
    finally:
        tar.unlink(missing_ok=True)
    return store_url(access, name), digest


def download(access: VolumeAccess, path: Path, expected: str = "") -> int:
    """Fetches checkpoint `path.name` from the checkpoint volume into `path` (absent here):
    its tar's sha256 checked against the one stored and against `expected` (the one its upload
    answered, kept by the controlplane: the workspace may write its bucket, so the stored one
    alone only shows corruption), unpacked beside `path`, every file verified, renamed into
    place; its size in bytes. ImageInvalid when the volume has no such checkpoint or it is
    corrupted or changed (nothing is left at `path`); StoreFailed for S3's errors."""
    name = path.name
    where = f"volume {access.name} ({store_url(access, name)})"
    folder = staging(path)
    tar = path.parent / f".{name}.download-{uuid.uuid4().hex[:8]}.tar"
    try:
        client = _s3(access)
        try:
            try:
                answer = client.get_object(
                    Bucket=access.bucket_name, Key=_key(access, name, TAR_SUM)
                )
                stored = answer["Body"].read().decode(errors="replace").split()
                client.download_file(access.bucket_name, _key(access, name, TAR), str(tar))
            except Exception as error:
                code, said = _s3_error(error)
                if code in ("NoSuchKey", "404", "NotFound"):
                    raise ImageInvalid(f"no checkpoint {name} in {where}") from None
                raise StoreFailed(
                    f"checkpoint {name}: its download from {where} failed: {said}"
                ) from None
        finally:
            client.close()
        got = _sha256(tar)
        if not stored or got != stored[0]:
            raise ImageInvalid(
                f"checkpoint {name} in {where}: {TAR} does not match its {TAR_SUM} (corrupted:"
                f" sha256 {got}, stored {stored[0] if stored else 'nothing'}); not restored"
            )
        if expected and got != expected:
            raise ImageInvalid(
                f"checkpoint {name} in {where}: {TAR} is not the image its checkpoint uploaded"
                f" (sha256 {got}, recorded {expected}: changed in the bucket since); not restored"
            )
        size = tar.stat().st_size
        _tar(["--extract", f"--file={tar}", f"--directory={folder}", "--numeric-owner",
              "--xattrs", "--same-permissions", "--same-owner"])  # fmt: skip
        verify(folder, f"{name} from {where}")
        if path.exists():  # another restore fetched it meanwhile: theirs is as good
            discard(folder)
        else:
            folder.rename(path)
            _fsync(path.parent)
    except BaseException:
        discard(folder)
        raise
    finally:
        tar.unlink(missing_ok=True)
    return size


async def copy_tree(source: Path, target: Path) -> None:
    """`cp -a` of `source`'s contents into `target` (owners, modes, xattrs, an overlay's
    whiteouts and sparse files kept)."""
    await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--sparse=always",
        f"{source}/.",
        str(target),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise CheckpointFailed(f"copying {source}: {err.decode(errors='replace').strip()}")
