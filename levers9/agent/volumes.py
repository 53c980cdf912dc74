"""A task's workspace volumes: its bucket FUSE-mounted on the worker, bound into its container.

Each volume of a task (`levers9 run --volume NAME:/data[:ro]`) is mounted before its container
starts, at a directory of the task's own under the agent's work dir, by a FUSE process of its
own (`rclone mount`, the default, or `s3fs`: `BACKENDS`), and unmounted when the task ends:
whatever the task wrote is then an object in the bucket (rclone, with its VFS cache in `writes`
mode, uploads a file once it is closed: `unmount` waits for its cache to hold nothing still to
upload, then for the FUSE process to end, and says which upload failed; s3fs uploads in the
close itself). Its files are the container user's (their host ids), `allow_other` so that the
task's user namespace may reach them; `:ro` mounts read-only. runc tasks get rclone (reads
about ten times s3fs's on a 1 GiB file), runsc tasks s3fs (gVisor's gofer cannot create files
through rclone's mount): benchmarks/README.md.

The workspace's credentials (VolumeAccess, decrypted by the controlplane for that RunTask) go
to the FUSE process alone, in its environment: never a file, never the task's environment. The
task sees files, not keys (its processes are in a PID namespace of their own and another user
namespace, so not even /proc/<pid>/environ of the FUSE process is theirs to read).

Before a mount, one ListObjectsV2 of the bucket's prefix with the same credentials says why it
could not be, in S3's words (`AccessDenied`, `NoSuchBucket`, `InvalidAccessKeyId`, the endpoint
unreachable), within `CHECK_S`; the task fails at start with `volume NAME: <error> on
s3://BUCKET/PREFIX` (VolumeError) and nothing else on the worker is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from levers9.agent.runtime import StartError
from levers9.logs import get_logger

log = get_logger("levers9.agent.volumes")

CHECK_S = 20.0
"""How long the bucket check before a mount may take (connect and read timeouts inside it)."""
MOUNTED_WITHIN_S = 20.0
"""How long a FUSE process may take to mount before the task fails at start."""
UNMOUNTED_WITHIN_S = 900.0
"""How long a FUSE process may take to end after its unmount: rclone uploads what the task
closed last (a checkpoint of tens of GiB takes minutes); past it, it is killed and says so."""
GCS_ENDPOINT = "https://storage.googleapis.com"
BACKENDS = ("s3fs", "rclone")
DEFAULT_BACKEND = "rclone"
"""Measured against moto (benchmarks/storage.py, benchmarks/README.md): reads about twice as
fast as s3fs's, writes alike; configured by environment only (no config file)."""


class VolumeError(StartError):
    """A volume could not be mounted: `volume NAME: <error> on s3://BUCKET/PREFIX`."""


@dataclass(frozen=True)
class VolumeAccess:
    """What mounts one volume (worker.proto VolumeAccess): the credentials never in a repr."""

    name: str
    bucket: str
    """s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"""
    endpoint: str = ""
    region: str = ""
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)

    @property
    def bucket_name(self) -> str:
        return self._split()[0]

    @property
    def prefix(self) -> str:
        """The prefix under the bucket, without slashes at either end ("": the whole bucket)."""
        return self._split()[1]

    @property
    def url(self) -> str:
        """As the task's failures name it."""
        return self.bucket.rstrip("/")

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint: the one given, else Google's for gs://, else AWS's for the region."""
        if self.endpoint:
            return self.endpoint.rstrip("/")
        if self.bucket.startswith("gs://"):
            return GCS_ENDPOINT
        return f"https://s3.{self.region or 'us-east-1'}.amazonaws.com"

    def _split(self) -> tuple[str, str]:
        rest = self.bucket.split("://", 1)[1] if "://" in self.bucket else self.bucket
        bucket, _, prefix = rest.partition("/")
        return bucket, prefix.strip("/")


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` is not `s3://BUCKET[/PREFIX]` or `gs://BUCKET[/PREFIX]`, or None."""
    scheme, sep, rest = bucket.partition("://")
    if not sep or scheme not in ("s3", "gs"):
        return f"{bucket!r} is not s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"
    name = rest.partition("/")[0]
    if not name or any(c in name for c in " \\:"):
        return f"{bucket!r} names no bucket"
    if any(part in (".", "..") for part in rest.split("/")[1:]):
        return f"{bucket!r} has . or .. in its prefix"
    return None


def _fail(access: VolumeAccess, error: str) -> VolumeError:
    return VolumeError(f"volume {access.name}: {error} on {access.url}")


async def check(access: VolumeAccess) -> None:
    """Lists at most one object of the volume's prefix with its credentials; VolumeError in
    S3's words when that cannot be, within CHECK_S."""
    problem = bucket_problem(access.bucket)
    if problem is not None:
        raise _fail(access, problem)
    try:
        error = await asyncio.wait_for(asyncio.to_thread(_list_one, access), CHECK_S + 5)
    except TimeoutError:
        error = f"the endpoint {access.endpoint_url} did not answer within {CHECK_S:.0f} s"
    if error is not None:
        raise _fail(access, error)


def _list_one(access: VolumeAccess) -> str | None:
    """The error listing the prefix gave (S3's code and message), or None."""
    import boto3
    import botocore
    import botocore.config
    import botocore.exceptions

    config = botocore.config.Config(
        connect_timeout=CHECK_S / 3,
        read_timeout=CHECK_S / 3,
        retries={"max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
        # No key: anonymous, never the agent's own (its environment, the node's role).
        signature_version=None if access.access_key_id else botocore.UNSIGNED,
    )
    client = boto3.session.Session(
        aws_access_key_id=access.access_key_id or None,
        aws_secret_access_key=access.secret_access_key or None,
    ).client(
        "s3",
        endpoint_url=access.endpoint_url,
        region_name=access.region or "us-east-1",
        config=config,
    )
    prefix = f"{access.prefix}/" if access.prefix else ""
    try:
        client.list_objects_v2(Bucket=access.bucket_name, Prefix=prefix, MaxKeys=1)
    except botocore.exceptions.ClientError as error:
        answer = error.response.get("Error", {})
        code = str(answer.get("Code") or "error")
        message = str(answer.get("Message") or "").strip()
        return f"{code}: {message}" if message and message != code else code
    except botocore.exceptions.EndpointConnectionError:
        return f"the endpoint {access.endpoint_url} is unreachable"
    except (botocore.exceptions.BotoCoreError, OSError) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        client.close()
    return None


@dataclass(frozen=True)
class Owner:
    """Who owns the mount's files as the node sees them: the container's user's host ids."""

    uid: int
    gid: int


def fuse_argv(
    backend: str, access: VolumeAccess, target: Path, owner: Owner, read_only: bool, cache: Path
) -> tuple[list[str], dict[str, str]]:
    """The FUSE process's command line and its whole environment (the credentials are there,
    and only there)."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(cache)}
    if backend == "rclone":
        remote = "L9"
        env.update(
            {
                f"RCLONE_CONFIG_{remote}_TYPE": "s3",
                # GCS through its S3 interface (an HMAC key) is "Other" to rclone 1.60.
                f"RCLONE_CONFIG_{remote}_PROVIDER": "Other"
                if access.endpoint or access.bucket.startswith("gs://")
                else "AWS",
                f"RCLONE_CONFIG_{remote}_ENDPOINT": access.endpoint_url,
                f"RCLONE_CONFIG_{remote}_REGION": access.region or "us-east-1",
                f"RCLONE_CONFIG_{remote}_ACCESS_KEY_ID": access.access_key_id,
                f"RCLONE_CONFIG_{remote}_SECRET_ACCESS_KEY": access.secret_access_key,
                f"RCLONE_CONFIG_{remote}_FORCE_PATH_STYLE": "true",
            }
        )
        path = "/".join(p for p in (access.bucket_name, access.prefix) if p)
        argv = [
            "rclone",
            "mount",
            f"{remote}:{path}",
            str(target),
            "--config",
            "/dev/null",  # environment only: no config file read or written
            "--allow-other",
            f"--uid={owner.uid}",
            f"--gid={owner.gid}",
            "--umask=022",
            "--dir-perms=0755",
            "--file-perms=0644",
            "--vfs-cache-mode=writes",
            "--vfs-write-back=0s",
            f"--cache-dir={cache}",
            "--contimeout=10s",
            "--timeout=60s",
            "--low-level-retries=3",
            # moto (the tests' and the dev stack's S3) answers a completed multipart upload
            # with VersionId null and then refuses a HEAD with it: one PUT up to S3's 5 GiB.
            "--s3-upload-cutoff=5G",
            "--log-level=ERROR",
        ]
        if read_only:
            argv.append("--read-only")
        return argv, env
    env.update(
        {
            "AWS_ACCESS_KEY_ID": access.access_key_id,
            "AWS_SECRET_ACCESS_KEY": access.secret_access_key,
        }
    )
    source = f"{access.bucket_name}:/{access.prefix}" if access.prefix else access.bucket_name
    options = [
        f"url={access.endpoint_url}",
        "use_path_request_style",
        f"endpoint={access.region or 'us-east-1'}",
        "allow_other",
        f"uid={owner.uid}",
        f"gid={owner.gid}",
        "umask=022",
        "mp_umask=022",
        "connect_timeout=10",
        "readwrite_timeout=60",
        "retries=3",
        "dbglevel=err",
        "ro" if read_only else "rw",
    ]
    if not access.access_key_id:
        options.append("public_bucket=1")
    return ["s3fs", source, str(target), "-f", "-o", ",".join(options)], env


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point of this mount namespace (a dead FUSE mount counts)."""
    wanted = str(path)
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 4 and _unescape(fields[4]) == wanted:
                return True
    return False


def mounts_under(root: Path) -> list[Path]:
    """The mount points at or below `root`, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 4:
                point = _unescape(fields[4])
                if point == str(root) or point.startswith(prefix):
                    found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _unescape(field_: str) -> str:
    return field_.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


async def mount(
    access: VolumeAccess,
    target: Path,
    owner: Owner,
    read_only: bool,
    *,
    backend: str = DEFAULT_BACKEND,
    check_first: bool = True,
) -> None:
    """Mounts the volume at `target` (made here) for the container's `owner`, read-only when
    asked; VolumeError (nothing left mounted) when it cannot, within CHECK_S +
    MOUNTED_WITHIN_S."""
    if backend not in BACKENDS:
        raise StartError(f"volume backend {backend!r} is none of {', '.join(BACKENDS)}")
    if check_first:
        await check(access)
    cache = _prepare(target)
    argv, env = fuse_argv(backend, access, target, owner, read_only, cache)
    errors = target.parent / f".{target.name}.log"
    with errors.open("wb") as err:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                # Its own session: it outlives an agent killed mid-task (a restarted agent
                # adopts the task and unmounts at its end); a signal to the agent's group
                # never reaches it.
                start_new_session=True,
            )
        except FileNotFoundError:
            raise _fail(access, f"{argv[0]} is not installed on this worker") from None
    deadline = time.monotonic() + MOUNTED_WITHIN_S
    while not mounted(target):
        if process.returncode is not None or time.monotonic() > deadline:
            why = _last_line(errors) or (
                f"{argv[0]} exited with {process.returncode}"
                if process.returncode is not None
                else f"{argv[0]} did not mount within {MOUNTED_WITHIN_S:.0f} s"
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            unmount(target)
            raise _fail(access, why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 0.05)
    (target.parent / f".{target.name}.pid").write_text(str(process.pid))
    log.info(
        "volume mounted",
        volume=access.name,
        bucket=access.url,
        backend=backend,
        target=str(target),
        read_only=read_only,
    )


def _prepare(target: Path) -> Path:
    """The mount point made (its folder reachable by the task's user namespace, not listable),
    and the FUSE process's cache folder beside it (the node root's alone)."""
    target.mkdir(parents=True, exist_ok=True)
    os.chmod(target.parent, 0o711)
    cache = target.parent / f".{target.name}.cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    return cache


def _last_line(path: Path, marks: tuple[str, ...] = ()) -> str:
    """The last line of the FUSE process's log (holding one of `marks`, when given)."""
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
        lines = [line for line in lines if line and (not marks or any(m in line for m in marks))]
        if lines:
            return lines[-1][:300]
    return ""


def unmount(target: Path) -> str:
    """Unmounts the volume at `target` and waits (at most UNMOUNTED_WITHIN_S) for its FUSE
    process to end, so that its last uploads are done; then removes the mount point. What went
    wrong with them, "" when nothing (an upload rclone reports failed: `x.txt: Failed to copy:
    AccessDenied: Access Denied`). Safe to call on one never mounted or already gone."""
    problem = ""
    pid_file = target.parent / f".{target.name}.pid"
    pid = 0
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
    if mounted(target):
        _wait_for_uploads(target)
        done = subprocess.run(
            ["fusermount3", "-u", str(target)], capture_output=True, check=False, timeout=30
        )
        if done.returncode != 0:
            # Busy or its FUSE process dead: lazily, so nothing on the worker stays stuck.
            subprocess.run(
                ["umount", "-l", str(target)], capture_output=True, check=False, timeout=30
            )
    if pid and _is_fuse(pid):
        started = time.monotonic()
        said = started
        while _is_fuse(pid) and time.monotonic() < started + UNMOUNTED_WITHIN_S:
            time.sleep(0.05)
            if time.monotonic() > said + 60:
                said = time.monotonic()
                log.warning(
                    "volume still uploading", target=str(target), seconds=int(said - started)
                )
        if _is_fuse(pid):
            log.error("volume process did not end after unmount: killed", pid=pid)
            problem = f"its uploads did not end within {UNMOUNTED_WITHIN_S:.0f} s of the task's end"
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    errors = target.parent / f".{target.name}.log"
    failed = _failed_upload(errors)
    if failed:
        log.error("volume upload failed", target=str(target), error=failed)
        problem = problem or failed
    last = _last_line(errors, ("ERROR", "[ERR]", "[CRT]"))
    if last:
        log.warning("volume process reported an error", target=str(target), error=last)
    for leftover in (pid_file, errors):
        leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        target.rmdir()
    cache = target.parent / f".{target.name}.cache"
    if cache.is_dir() and not mounted(cache):
        subprocess.run(["rm", "-rf", "--one-file-system", str(cache)], check=False, timeout=60)
    return problem


def _wait_for_uploads(target: Path) -> None:
    """Returns once rclone's write cache for `target` holds no file still to upload (its
    `vfsMeta` says `"Dirty": true` until the upload is done), one failed, or UNMOUNTED_WITHIN_S
    is over: rclone quits with what it has not begun to upload left in its cache (for a later
    run of it, which there is not), so the unmount waits here first. s3fs keeps no such cache:
    its uploads are done when the task's close returns."""
    meta = target.parent / f".{target.name}.cache" / "vfsMeta"
    errors = target.parent / f".{target.name}.log"
    deadline = time.monotonic() + UNMOUNTED_WITHIN_S
    while time.monotonic() < deadline and not _failed_upload(errors):
        dirty = False
        with contextlib.suppress(OSError):
            for folder, _, names in os.walk(meta):
                for name in names:
                    with contextlib.suppress(OSError):
                        if '"Dirty": true' in (Path(folder) / name).read_text():
                            dirty = True
                            break
                if dirty:
                    break
        if not dirty:
            return
        time.sleep(0.05)


def _failed_upload(log_path: Path) -> str:
    """The first upload rclone reports failed in its log (`x.txt: Failed to copy: ...`)."""
    with contextlib.suppress(OSError):
        for line in log_path.read_text(errors="replace").splitlines():
            _, mark, said = line.partition(" ERROR : ")
            if mark and ("Failed to copy" in said or "failed to transfer" in said):
                return said.strip()[:300]
    return ""


def _is_fuse(pid: int) -> bool:
    """Whether `pid` is still a FUSE process this module started (s3fs or rclone)."""
    try:
        # A zombie child of this agent counts as ended.
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, IndexError):
        return False
    return name in BACKENDS
