"""deploy/gpu/check-runc.sh, the GPU check for any host with an NVIDIA driver, as a user runs
it: here (no card) it runs the probe in the Python image under runc and prints what the
container saw, with `"host": "runc"`; as `levers9 pool check`, a container that saw no card
fails the check (exit 1, `FAILED` with a reason naming what to check) unless `--simulated-gpus`
says the host's cards are simulated, which passes saying so; more cards than the host has is
refused by name. Those runs are root only (runc); the verdict itself (each branch: exit code,
a result that is no JSON object, no card given, no card seen, simulated, a card seen, a bad
matmul) is checked without runc."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from levers9.agent.cdi import node_cards
from levers9.records.tasks import SIMULATED_NO_CARD

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)")
GPU = Path(__file__).parents[2] / "deploy" / "gpu"
SCRIPT = GPU / "check-runc.sh"
NONE_SEEN: dict[str, object] = {"nvidia_smi": None, "cuda": False, "device": None}
H200: dict[str, object] = {
    "nvidia_smi": "NVIDIA H200, 143771 MiB",
    "cuda": True,
    "device": "NVIDIA H200",
    "matmul_ok": True,
}


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_runc", GPU / "check_runc.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_runc = _module()


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def _report(stdout: str, verdict: str) -> dict[str, object]:
    start = stdout.index(f"{verdict} {{") + len(verdict) + 1
    report: dict[str, object] = json.loads(stdout[start : stdout.index("\n}\n", start) + 2])
    return report


def _verdict(
    capsys: pytest.CaptureFixture[str],
    seen: dict[str, object],
    code: int = 0,
    *,
    gpus: int = 1,
    simulated: bool = False,
) -> tuple[bool, str]:
    passed = check_runc.report_check(json.dumps(seen), code, gpus=gpus, simulated=simulated)
    return passed, capsys.readouterr().out


def test_a_card_seen_passes_and_says_nothing_of_simulation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for simulated in (False, True):
        passed, out = _verdict(capsys, H200, simulated=simulated)
        assert passed
        assert out.startswith("COMPLETE {"), out
        assert _report(out, "COMPLETE") == {"host": "runc", **H200}


def test_no_card_seen_fails_naming_the_host_s_driver(capsys: pytest.CaptureFixture[str]) -> None:
    passed, out = _verdict(capsys, NONE_SEEN, gpus=1)
    assert not passed
    assert out.startswith("FAILED {"), out
    assert _report(out, "FAILED")["reason"] == (
        "the container saw no GPU: check the host's driver (nvidia-smi on the host, its"
        " libraries under /usr/local/nvidia/lib64 or in the loader's cache) and its /dev/nvidiaN"
        " nodes"
    )


def test_no_card_given_fails_naming_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    passed, out = _verdict(capsys, NONE_SEEN, gpus=0)
    assert not passed
    assert _report(out, "FAILED")["reason"] == (
        "the container saw no GPU: it was given none (--gpus 0): give it a card (--gpus 1), or"
        " say --simulated-gpus where the host's cards are simulated"
    )


def test_no_card_seen_passes_where_the_cards_are_simulated_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for gpus in (0, 1):
        passed, out = _verdict(capsys, NONE_SEEN, gpus=gpus, simulated=True)
        assert passed
        assert out.startswith(f"{SIMULATED_NO_CARD}\nCOMPLETE {{"), out
        assert "reason" not in _report(out, "COMPLETE")


def test_a_probe_that_failed_fails_even_where_the_cards_are_simulated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    passed, out = _verdict(capsys, {}, 3, simulated=True)
    assert not passed
    assert SIMULATED_NO_CARD not in out
    assert _report(out, "FAILED")["reason"] == "exited with code 3"


@pytest.mark.parametrize("printed", ["42", "[1]", "not json"])
def test_a_result_that_is_no_json_object_fails_even_where_the_cards_are_simulated(
    capsys: pytest.CaptureFixture[str], printed: str
) -> None:
    passed = check_runc.report_check(printed, 0, gpus=0, simulated=True)
    out = capsys.readouterr().out
    assert not passed
    assert SIMULATED_NO_CARD not in out
    report = _report(out, "FAILED")
    assert report["unparsed"] == printed
    assert report["reason"] == (
        "the probe's result is not a JSON object (under `unparsed`): check that the image"
        " (--layout) runs levers9's levers9-probe"
    )


def test_a_matmul_that_disagreed_fails(capsys: pytest.CaptureFixture[str]) -> None:
    passed, out = _verdict(capsys, {**H200, "matmul_ok": False})
    assert not passed
    assert _report(out, "FAILED")["reason"] == "the matmul on the GPU disagreed with the CPU's"


@pytest.mark.integration
@ROOT
def test_the_check_runs_the_probe_in_runc_where_the_cards_are_simulated() -> None:
    done = _check("--gpus", "0", "--simulated-gpus")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"\n{SIMULATED_NO_CARD}\nCOMPLETE {{" in done.stdout, done.stdout
    report = _report(done.stdout, "COMPLETE")
    assert list(report) == ["host", "nvidia_smi", "cuda", "device", "matmul_ok"]
    assert report["host"] == "runc"
    assert "--- what the container printed:" in done.stdout


@pytest.mark.integration
@ROOT
def test_a_container_that_saw_no_card_fails_the_check() -> None:
    done = _check("--gpus", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "\nFAILED {" in done.stdout, done.stdout
    assert SIMULATED_NO_CARD not in done.stdout
    report = _report(done.stdout, "FAILED")
    assert (report["host"], report["nvidia_smi"], report["device"]) == ("runc", None, None)
    assert str(report["reason"]).startswith("the container saw no GPU: it was given none")


@pytest.mark.integration
@ROOT
def test_more_cards_than_the_host_has_is_refused() -> None:
    have = len(node_cards(Path("/dev")))
    done = _check("--gpus", str(have + 1))
    assert done.returncode == 2
    assert f"--gpus {have + 1}, but this host has {have} cards" in done.stderr
