"""deploy/gpu/check-runc.sh, the GPU check for any host with an NVIDIA driver, as a user runs
it: here (no card) it runs the probe in the Python image under runc and prints `COMPLETE` with
`"host": "runc"` and what the container saw; more cards than the host has is refused by name.
Root only (runc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from levers9.worker.cdi import node_cards

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]
SCRIPT = Path(__file__).parents[2] / "deploy" / "gpu" / "check-runc.sh"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def test_the_check_runs_the_probe_in_runc() -> None:
    done = _check("--gpus", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    start = done.stdout.index("COMPLETE {") + len("COMPLETE ")
    report = json.loads(done.stdout[start : done.stdout.index("\n}\n", start) + 2])
    assert report["host"] == "runc"
    assert list(report) == ["host", "nvidia_smi", "cuda", "device", "matmul_ok"]
    assert "--- what the container printed:" in done.stdout


def test_more_cards_than_the_host_has_is_refused() -> None:
    have = len(node_cards(Path("/dev")))
    done = _check("--gpus", str(have + 1))
    assert done.returncode == 2
    assert f"--gpus {have + 1}, but this host has {have} cards" in done.stderr
