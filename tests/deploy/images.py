"""Builds deploy/images/*.Dockerfile for real, without a Docker engine or Docker Hub, and runs
what it built.

- The base image (`FROM python:X.Y.Z-slim-<release>`) cannot be pulled here: only the package
  registries are reachable. A stand-in takes its name in a private containers-storage: Debian
  <release>'s own root filesystem made by mmdebstrap (minbase, python3, python3-venv,
  python-is-python3, ca-certificates), with this machine's CA bundle so that pip and apt reach
  the registries through its TLS proxy. It is Debian's python3 (3.11.2 on bookworm), not
  python.org's X.Y.Z under /usr/local: `stand_in_python` says which, and the tests require the
  same major.minor. The tar is kept in the task images' cache (sandbox.task_images), keyed by
  its recipe and the CA bundle.
- `buildah bud --isolation chroot --pull=never --layers` builds each Dockerfile from the
  repository root, as `docker build -f deploy/images/X.Dockerfile .` does (/.dockerignore
  included). Both builder stages are the same, so the second build reuses the first's.
- `run_image` runs a built image as a runtime would: its rootfs (`buildah mount`) under runc
  with the image's USER, WORKDIR, ENV and ENTRYPOINT/CMD (or a pod's command and env over
  them), a read-only root when asked (the chart's `readOnlyRootFilesystem`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.task_images import cache_dir

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "deploy" / "images"
CONTROLPLANE = IMAGES / "controlplane.Dockerfile"
WORKER = IMAGES / "worker.Dockerfile"
DOCKERFILES = (CONTROLPLANE, WORKER)
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
STAND_IN_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
STAND_IN_BUILD = "1"
"""Bump when the stand-in's recipe changes: it is part of the cache key."""
EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SOURCE_DATE_EPOCH = "1767225600"
TOOLS = ("buildah", "mmdebstrap", "runc")
INSTALL = "deploy/dev/install-tools.sh (Debian packages buildah, mmdebstrap, runc)"
PIN = re.compile(r"python:(\d+)\.(\d+)\.(\d+)-slim-([a-z]+)")
_FROM = re.compile(r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE | re.M)


class ImageBuildError(AssertionError):
    """A build step failed; the message names the command and ends with its output."""


def missing_tools() -> list[str]:
    """What this machine lacks to build and run the images (root included)."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if os.geteuid() != 0:
        missing.append("root (buildah's chroot isolation and runc)")
    return missing


BACKGROUND = ("nice", "-n", "19", "ionice", "-c", "2", "-n", "7")
"""How the builds run: at the lowest CPU and I/O priority. They take minutes of CPU on a
2-core machine where the suite's other modules run beside them with second-long timeouts (a
cold start within 3 s): a full run once failed seven endpoint tests and a runc test while both
builds ran at the suite's priority. Niced, the builds take what the rest leaves idle."""


def _run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        [*BACKGROUND, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-40:])
        raise ImageBuildError(f"{' '.join(argv[:4])} ... exited {done.returncode}:\n{tail}")
    return done.stdout


def base_images(dockerfile: Path) -> list[str]:
    """The images the Dockerfile's stages start FROM, stage names left out, in order."""
    stages: set[str] = set()
    images: list[str] = []
    for match in _FROM.finditer(dockerfile.read_text()):
        image, name = match.group(1), match.group(2)
        if image not in stages and image not in images:
            images.append(image)
        if name:
            stages.add(name)
    return images


def debian_release(image: str) -> str:
    """`bookworm` of `python:3.11.13-slim-bookworm`; the pin's format is checked by the tests."""
    match = PIN.fullmatch(image)
    if match is None:
        raise ImageBuildError(f"{image}: no stand-in for a base that is not python:X.Y.Z-slim-R")
    return match.group(4)


# --- the stand-in base ---------------------------------------------------------------------------


def stand_in_tar(release: str) -> Path:
    """Debian `release`'s root filesystem as a tar, built once per machine (about a minute)."""
    ca = HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.exists() else b""
    recipe = "\0".join((STAND_IN_BUILD, release, *STAND_IN_PACKAGES, *EXCLUDED)).encode()
    key = hashlib.sha256(recipe + ca).hexdigest()[:16]
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    tar = root / f"dockerfile-base-{release}-{key}.tar"
    with (root / ".dockerfile-base.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tar.exists():
            return tar
        partial = tar.with_suffix(".partial.tar")
        # The host's CA bundle: the TLS proxy in front of the registries here, if any, is in it.
        hook = f'cp {HOST_CA_BUNDLE} "$1{HOST_CA_BUNDLE}"' if ca else "true"
        try:
            _run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    f"--include={','.join(STAND_IN_PACKAGES)}",
                    "--dpkgopt=force-unsafe-io",
                    *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDED),
                    f"--customize-hook={hook}",
                    release,
                    str(partial),
                ],
                timeout=900,
                env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
            )
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.rename(tar)
    return tar


# --- buildah -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    name: str
    config: Mapping[str, Any]
    """The image's OCI config (`Entrypoint`, `Cmd`, `Env`, `User`, `ExposedPorts`, ...)."""

    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.config.get("Env") or [])


@dataclass
class Buildah:
    """buildah with a containers-storage of its own under `home` (overlay)."""

    home: Path
    stand_in_python: str = ""
    _containers: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 120) -> str:
        storage = [
            "--root",
            str(self.home / "storage"),
            "--runroot",
            str(self.home / "run"),
            "--storage-driver",
            "overlay",
        ]
        return _run(["buildah", *storage, *args], timeout=timeout).strip()

    def stand_in(self, images: Sequence[str]) -> None:
        """Tags one stand-in per distinct Debian release under each base image's name."""
        for release in sorted({debian_release(i) for i in images}):
            tar = stand_in_tar(release)
            container = self("from", "--pull=never", "scratch")
            try:
                self("add", container, str(tar), "/", timeout=300)
                self("config", "--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8", container)
                self("config", "--cmd", "python3", container)
                for image in images:
                    if debian_release(image) == release:
                        self("commit", "-q", container, image, timeout=300)
            finally:
                self("rm", container)
        versions = sorted((self.rootfs(images[0]) / "usr/lib").glob("python3.*"))
        self.stand_in_python = versions[-1].name.removeprefix("python") if versions else ""

    def build(self, dockerfile: Path, tag: str, log: Path) -> Built:
        """`buildah bud` of `dockerfile` with the repository as its context; the full output
        goes to `log`, its tail into the error."""
        argv = [
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "--layers",
            "--timestamp",
            SOURCE_DATE_EPOCH,
            "-f",
            str(dockerfile),
            "-t",
            tag,
            str(ROOT),
        ]
        try:
            out = self(*argv, timeout=1200)
        except ImageBuildError as error:
            log.write_text(str(error))
            raise
        log.write_text(out)
        return Built(tag, self.config(tag))

    def config(self, image: str) -> dict[str, Any]:
        inspected = json.loads(self("inspect", "--type", "image", image))
        config: dict[str, Any] = inspected["OCIv1"]["config"]
        return config

    def rootfs(self, image: str) -> Path:
        """A new working container of `image`, mounted; removed by `close`."""
        container = self("from", "--pull=never", "--name", f"l9-{uuid.uuid4().hex[:12]}", image)
        self._containers.append(container)
        return Path(self("mount", container))

    def close(self) -> None:
        for container in self._containers:
            with contextlib.suppress(ImageBuildError):
                self("umount", container)
            with contextlib.suppress(ImageBuildError):
                self("rm", container)
        self._containers.clear()

    def purge(self) -> None:
        """Every container and image gone, then the storage itself."""
        self.close()
        with contextlib.suppress(ImageBuildError):
            self("rmi", "--all", "--force", timeout=300)
        shutil.rmtree(self.home, ignore_errors=True)


# --- running an image under runc -----------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    source: Path
    destination: str
    readonly: bool = False


def argv_of(
    config: Mapping[str, Any], command: Sequence[str] = (), args: Sequence[str] = ()
) -> list[str]:
    """What a kubelet runs: the pod's command replaces ENTRYPOINT and drops CMD; its args
    replace CMD."""
    entrypoint = list(command) or list(config.get("Entrypoint") or [])
    rest = list(args) if (args or command) else list(config.get("Cmd") or [])
    return entrypoint + rest


def _ids(user: str) -> tuple[int, int]:
    uid, _, gid = (user or "0").partition(":")
    if uid in ("", "root"):
        return 0, int(gid or 0)
    return int(uid), int(gid or uid)


def bundle(
    where: Path,
    rootfs: Path,
    config: Mapping[str, Any],
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    readonly: bool = False,
    mounts: Sequence[Mount] = (),
    host_network: bool = False,
) -> Path:
    """A runc bundle running `argv` in `rootfs` as the image says: USER, WORKDIR, ENV with
    `env` over it (as a pod's env wins), a tmpfs on /tmp (the chart's emptyDir)."""
    where.mkdir(parents=True, exist_ok=True)
    _run(["runc", "spec", "--bundle", str(where)], timeout=30)
    spec_path = where / "config.json"
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    image_env = dict(e.split("=", 1) for e in config.get("Env") or [])
    merged = {**image_env, **(env or {})}
    uid, gid = _ids(str(config.get("User") or ""))
    spec["root"] = {"path": str(rootfs), "readonly": readonly}
    spec["process"].update(
        terminal=False,
        args=list(argv),
        env=[f"{k}={v}" for k, v in merged.items()],
        cwd=config.get("WorkingDir") or "/",
        user={"uid": uid, "gid": gid},
    )
    spec["mounts"].append(
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}
    )
    for mount in mounts:
        options = ["rbind", "ro" if mount.readonly else "rw"]
        spec["mounts"].append(
            {
                "destination": mount.destination,
                "type": "bind",
                "source": str(mount.source),
                "options": options,
            }
        )
    if host_network:
        spec["linux"]["namespaces"] = [
            n for n in spec["linux"]["namespaces"] if n["type"] != "network"
        ]
    spec["hostname"] = "levers9-image-test"
    spec_path.write_text(json.dumps(spec))
    return where


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str


def run_bundle(path: Path, state: Path, *, timeout: float = 120) -> Ran:
    """`runc run` of the bundle to its end; stdout and stderr together."""
    name = f"l9-{uuid.uuid4().hex[:12]}"
    argv = ["runc", "--root", str(state), "run", "--bundle", str(path), name]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(
            ["runc", "--root", str(state), "delete", "--force", name],
            capture_output=True,
            timeout=30,
            check=False,
        )
    return Ran(done.returncode, done.stdout + done.stderr)


@contextlib.contextmanager
def started(path: Path, state: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`runc run` of the bundle in the background, its output into `log`; on exit it is
    killed if still running and deleted."""
    name = f"l9-{uuid.uuid4().hex[:12]}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["runc", "--root", str(state), "run", "--bundle", str(path), name],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            subprocess.run(
                ["runc", "--root", str(state), "kill", name, str(int(signal.SIGKILL))],
                capture_output=True,
                timeout=30,
                check=False,
            )
            process.wait(timeout=30)
        subprocess.run(
            ["runc", "--root", str(state), "delete", "--force", name],
            capture_output=True,
            timeout=30,
            check=False,
        )
