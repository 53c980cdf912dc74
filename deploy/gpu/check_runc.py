"""The GPU check on any Linux host with an NVIDIA driver, without a cluster: the worker's own
runc runtime starts `levers9-probe` in a container with the host's real driver and device nodes
(through the CDI spec the worker generates) and prints what the container saw, as `levers9
pool check` does.

    sudo deploy/gpu/check-runc.sh [--gpus 1] [--layout DIR:TAG] [--simulated-gpus]

- The image: the Python task image (sandbox/task_images.py, mmdebstrap; built once and cached)
  or any OCI layout given with `--layout` (a PyTorch image with `levers9-probe` on its PATH for
  `"cuda": true`). It is served from a loopback registry and pulled into a scratch image cache
  as a worker pulls it.
- The driver: `/usr/local/nvidia` where the host has it (GKE's layout); otherwise the driver's
  libraries found with `ldconfig -p` (libcuda, libnvidia-*) and `nvidia-smi` are copied into a
  scratch `/usr/local/nvidia` of that layout, as GKE's installer lays them out.
- The cards: `/dev/nvidia0..N-1` for `--gpus N`, plus the control devices the host has.

Prints `COMPLETE {json}` (exit 0) or `FAILED {json}` (exit 1), then the container's output.
As `levers9 pool check`, a container that saw no card (`nvidia_smi` and `device` null, `cuda`
false) fails the check, with a `reason` that says what to look at, unless `--simulated-gpus`
says the host's cards are simulated (a machine without one, as the sandbox's): then it prints
`simulated cards: no GPU was visible, as expected` before `COMPLETE`. A matmul on the card
that disagreed with the CPU's fails it too, as does a result that is no JSON object (shown
under `unparsed`).
Needs root (runc), runc, umoci, skopeo and docker-registry (deploy/dev/install-tools.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from levers9.agent.cdi import CdiError, node_cards
from levers9.agent.images import ImageCache
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import ContainerSpec, StartError
from levers9.records.tasks import CHECK_KEYS, SIMULATED_NO_CARD, saw_no_card
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import python_image

LIBRARIES = re.compile(r"^(libcuda|libnvidia-[a-z0-9-]+|libnvcuvid|libnvoptix)\.so(\.\d+)*$")
WAIT_S = 300
NONE_GIVEN = (
    "the container saw no GPU: it was given none (--gpus 0): give it a card (--gpus 1), or say"
    " --simulated-gpus where the host's cards are simulated"
)
NONE_SEEN = (
    "the container saw no GPU: check the host's driver (nvidia-smi on the host, its libraries"
    " under /usr/local/nvidia/lib64 or in the loader's cache) and its /dev/nvidiaN nodes"
)
BAD_MATMUL = "the matmul on the GPU disagreed with the CPU's"
NOT_AN_OBJECT = (
    "the probe's result is not a JSON object (under `unparsed`): check that the image (--layout)"
    " runs levers9's levers9-probe"
)


def driver_root(scratch: Path) -> Path:
    """The host's `/usr/local/nvidia`, or one assembled from the loader's driver libraries."""
    gke = Path("/usr/local/nvidia")
    if (gke / "lib64").is_dir():
        return gke
    root = scratch / "nvidia"
    (root / "lib64").mkdir(parents=True)
    (root / "bin").mkdir()
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    found: dict[str, Path] = {}
    for line in listing.stdout.splitlines():
        entry, _, target = line.strip().partition(" => ")
        name = entry.split(" ", 1)[0]
        if LIBRARIES.match(name) and ("x86-64" in line or "AArch64" in line):
            found.setdefault(name, Path(target))
    for name, library in found.items():
        shutil.copy2(library.resolve(), root / "lib64" / name)
    smi = shutil.which("nvidia-smi")
    if smi:
        shutil.copy2(smi, root / "bin" / "nvidia-smi")
    print(
        f"driver: {len(found)} libraries from the loader's cache"
        f"{', nvidia-smi' if smi else ', no nvidia-smi'} -> {root}",
        file=sys.stderr,
    )
    return root


async def check(gpus: int, layout: Path | None, tag: str, *, simulated: bool = False) -> int:
    if os.geteuid() != 0:
        print("error: runc needs root: sudo deploy/gpu/check-runc.sh", file=sys.stderr)
        return 2
    if layout is None:
        layout, tag = python_image(lambda line: print(line, file=sys.stderr))
    cards = node_cards(Path("/dev"))
    if gpus > len(cards):
        print(
            f"error: --gpus {gpus}, but this host has {len(cards)} cards (/dev/nvidiaN)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="levers9-gpu-check-") as scratch_dir:
        scratch = Path(scratch_dir)
        with LocalRegistry(scratch / "registry") as registry:
            image = f"{registry.address}/check/probe:{tag}"
            push_layout(layout, image, tag)
            cache = ImageCache(scratch / "images", insecure=[registry.address])
            try:
                runtime = RuncRuntime(
                    cache, scratch / "runc", driver_root=driver_root(scratch), cards=cards[:gpus]
                )
            except CdiError as error:
                print(f"FAILED {json.dumps({'host': 'runc', 'reason': str(error)})}")
                return 1
            print(f"CDI spec: {runtime.cdi_spec.read_text()}", file=sys.stderr)
            spec = ContainerSpec(
                task_id=f"gpu-check-{os.getpid()}",
                image=image,
                command=("sh", "-c", "ls /dev | grep nvidia >&2; exec levers9-probe"),
                env={},
                gpu_indices=tuple(cards[:gpus]),
                result_path=scratch / "task" / "result" / "result.json",
                work_dir=scratch / "task" / "work",
            )
            output = bytearray()
            try:
                container = await runtime.start(spec, output.extend)
            except StartError as error:
                print(f"FAILED {json.dumps({'host': 'runc', 'reason': str(error)})}")
                return 1
            code = await asyncio.wait_for(container.wait(), WAIT_S)
            printed = spec.result_path.read_text() if spec.result_path.exists() else ""
    passed = report_check(printed, code, gpus=gpus, simulated=simulated)
    print("--- what the container printed:")
    print(output.decode(errors="replace"), end="")
    return 0 if passed else 1


def failure(report: dict[str, object], code: int, *, gpus: int, simulated: bool) -> str | None:
    """Why the check failed, or None: the probe's exit, a result that is no JSON object, no
    card seen (unless the cards are simulated), or a matmul that disagreed with the CPU's; the
    rule of `levers9 pool check`."""
    if code != 0:
        return f"exited with code {code}"
    if "unparsed" in report:
        return NOT_AN_OBJECT
    if saw_no_card(report):
        if simulated:
            return None
        return NONE_GIVEN if gpus == 0 else NONE_SEEN
    if report.get("matmul_ok") is False:
        return BAD_MATMUL
    return None


def report_check(printed: str, code: int, *, gpus: int, simulated: bool) -> bool:
    """Prints `COMPLETE {json}` (True) or `FAILED {json}` with its reason (False) for what the
    probe wrote (`printed`); where the cards are simulated and none was seen, says so on the
    line before."""
    try:
        seen = json.loads(printed) if printed else {}
    except ValueError:
        seen = None
    result = {"host": "runc", **(seen if isinstance(seen, dict) else {})}
    report: dict[str, object] = {key: result.get(key) for key in CHECK_KEYS}
    if not isinstance(seen, dict):
        report["unparsed"] = printed
    reason = failure(report, code, gpus=gpus, simulated=simulated)
    if reason:
        report["reason"] = reason
    elif simulated and saw_no_card(report):
        print(SIMULATED_NO_CARD)
    print(("FAILED " if reason else "COMPLETE ") + json.dumps(report, indent=2))
    return reason is None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1, help="cards to give the container")
    parser.add_argument("--layout", default="", help="an OCI layout DIR:TAG to run instead")
    parser.add_argument(
        "--simulated-gpus",
        action="store_true",
        help="the host's cards are simulated (it has none): a container that saw no card passes",
    )
    arguments = parser.parse_args()
    layout, tag = None, ""
    if arguments.layout:
        directory, _, tag = arguments.layout.rpartition(":")
        if not directory or not (Path(directory) / "index.json").exists():
            parser.error(f"--layout {arguments.layout!r}: not an OCI layout DIR:TAG")
        layout = Path(directory)
    sys.exit(asyncio.run(check(arguments.gpus, layout, tag, simulated=arguments.simulated_gpus)))


if __name__ == "__main__":
    main()
