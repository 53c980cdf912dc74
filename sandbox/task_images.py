"""Images for tasks, built here without Docker Hub or a daemon: an OCI layout made with umoci,
pushed to a loopback registry with skopeo.

Push one with `sandbox.registries.push_layout(layout, "127.0.0.1:port/repo:tag", tag)`.

`python`: a Debian root filesystem with Python 3 (mmdebstrap, about 30 s), `levers9-probe` (the
GPU check's task) on its PATH, built once per machine and kept under the user's cache
(`$XDG_CACHE_HOME/levers9/task-images`, or `LEVERS9_TASK_IMAGE_CACHE`); `python_image()` returns
the cached layout and its tag. It is the dev stack's default task image and the benchmarks' image.

`busybox`: Debian's static busybox as `/bin/busybox` with its applets linked (`sh`, `cat`,
`ps`, `ls`, ...), an `Env` and `Cmd` of its own, a working directory owned by its user (uid
1000), so what a runtime must honour of an image's config and files is all there. It builds in
about a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from levers9 import probe

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "ls", "ps", "env", "id", "echo", "sleep", "true", "false", "head", "wc")


class TaskImageError(RuntimeError):
    """A test image cannot be built; the message names the tool or package missing."""


SUITE = "bookworm"
PYTHON_PACKAGES = ("python3",)
PYTHON_TAG = "3.11"
PYTHON_BUILD = "1"
"""Bump when the recipe below changes: it is part of the cache key."""
SOURCE_DATE_EPOCH = "1767225600"
"""2026-01-01: file times in the root filesystem (mmdebstrap honours it)."""
EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(*argv: str, timeout: float = 300) -> str:
    if shutil.which(argv[0]) is None:
        raise TaskImageError(f"{argv[0]} is not installed (deploy/dev/install-tools.sh)")
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise TaskImageError(f"{' '.join(argv[:3])} failed: {tail}")
    return done.stdout


def cache_dir() -> Path:
    """Where built task images are kept between runs."""
    configured = os.environ.get("LEVERS9_TASK_IMAGE_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "levers9" / "task-images"


def _probe_source() -> bytes:
    return Path(probe.__file__).read_bytes()


def _extras_layer(path: Path) -> None:
    """`levers9-probe` on the PATH and `python` beside `python3`, as one more layer."""
    script = b"#!/usr/bin/python3\n" + _probe_source()
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("usr", "usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(SOURCE_DATE_EPOCH)
            tar.addfile(info)
        info = tarfile.TarInfo("usr/local/bin/levers9-probe")
        info.size, info.mode, info.mtime = len(script), 0o755, int(SOURCE_DATE_EPOCH)
        tar.addfile(info, io.BytesIO(script))
        link = tarfile.TarInfo("usr/bin/python")
        link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "python3", int(SOURCE_DATE_EPOCH)
        tar.addfile(link)


def python_key() -> str:
    """The cache key: the recipe, the suite, the packages and the probe's source."""
    recipe = "\0".join((PYTHON_BUILD, SUITE, *PYTHON_PACKAGES, *EXCLUDED)).encode()
    return hashlib.sha256(recipe + _probe_source()).hexdigest()[:16]


def python_image(progress: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """The Python image's OCI layout and tag, built on the first call on this machine (about
    30 s with mmdebstrap, which fetches Debian's packages) and read from the cache after.
    Concurrent callers build it once (a lock beside the cache)."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    layout = root / f"python-{python_key()}"
    if (layout / "index.json").exists():
        return layout, PYTHON_TAG
    with (root / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (layout / "index.json").exists():
            if progress is not None:
                progress("building the Python task image with mmdebstrap (once per machine)")
            _build_python(layout)
    return layout, PYTHON_TAG


def _build_python(layout: Path) -> None:
    with tempfile.TemporaryDirectory(dir=layout.parent, prefix=".build-") as work:
        rootfs_tar = Path(work) / "rootfs.tar"
        _run(
            "mmdebstrap",
            "--quiet",
            "--variant=essential",
            f"--include={','.join(PYTHON_PACKAGES)}",
            "--skip=output/dev",
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDED),
            SUITE,
            str(rootfs_tar),
            timeout=900,
        )
        extras = Path(work) / "extras.tar"
        _extras_layer(extras)
        staged = Path(work) / "layout"
        image = f"{staged}:{PYTHON_TAG}"
        _run("umoci", "init", "--layout", str(staged))
        _run("umoci", "new", "--image", image)
        _run("umoci", "raw", "add-layer", "--image", image, str(rootfs_tar))
        _run("umoci", "raw", "add-layer", "--image", image, str(extras))
        _run(
            "umoci",
            "config",
            "--image",
            image,
            "--config.cmd=python3",
            f"--config.env=PATH={PATH}",
            "--config.env=LANG=C.UTF-8",
            "--config.workingdir=/",
            "--config.label=org.opencontainers.image.title=levers9 python task image",
        )
        _run("umoci", "gc", "--layout", str(staged))
        staged.rename(layout)


def build_busybox(layout: Path, tag: str = "busybox", marker: str = "") -> Path:
    """The busybox image as `layout:tag`; `marker` becomes `/etc/levers9-marker` (two markers,
    two images with different digests). Returns the layout."""
    if not BUSYBOX.exists():
        raise TaskImageError(f"{BUSYBOX} is missing: apt-get install busybox-static")
    if not (layout / "index.json").exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    with tempfile.TemporaryDirectory() as work:
        bundle = Path(work) / "bundle"
        _run("umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle))
        rootfs = bundle / "rootfs"
        for folder in ("bin", "etc", "tmp", "work", "proc", "dev", "sys"):
            (rootfs / folder).mkdir(exist_ok=True)
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in APPLETS:
            os.symlink("busybox", rootfs / "bin" / applet)
        (rootfs / "etc" / "passwd").write_text(
            "root:x:0:0::/root:/bin/sh\ntask:x:1000:1000::/work:/bin/sh\n"
        )
        (rootfs / "etc" / "group").write_text("root:x:0:\ntask:x:1000:\n")
        (rootfs / "etc" / "levers9-marker").write_text(marker)
        # The image's user owns its working directory, as images give their user one: a runtime
        # must keep that owner (a user namespace shifts it, it does not lose it).
        os.chown(rootfs / "work", 1000, 1000)
        _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    _run(
        "umoci",
        "config",
        "--image",
        f"{layout}:{tag}",
        "--config.cmd=/bin/sh",
        "--config.cmd=-c",
        "--config.cmd=echo hello from busybox",
        "--config.env=PATH=/bin",
        "--config.env=IMAGE_GREETING=hello",
        "--config.workingdir=/work",
        "--config.user=task",
    )
    return layout
