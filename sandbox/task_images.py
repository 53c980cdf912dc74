"""Images for tasks, built here without Docker Hub or a daemon: an OCI layout made with umoci,
pushed to a loopback registry with skopeo.

Push one with `sandbox.registries.push_layout(layout, "127.0.0.1:port/repo:tag", tag)`.

`busybox`: Debian's static busybox as `/bin/busybox` with its applets linked (`sh`, `cat`,
`ps`, `ls`, ...), an `Env` and `Cmd` of its own, a working directory and a user, so what a
runtime must honour of an image's config is all there. It builds in about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "ls", "ps", "env", "id", "echo", "sleep", "true", "false", "head", "wc")


class TaskImageError(RuntimeError):
    """A test image cannot be built; the message names the tool or package missing."""


def _run(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        raise TaskImageError(f"{argv[0]} is not installed (deploy/dev/install-tools.sh)")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise TaskImageError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()}")
    return done.stdout


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
