"""The suite's report (tests/suite_report.py): counts ran, skipped and failed, and fails a CI
run on a skip that is not allowed, read from a real pytest run of tests/suite_probe.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import suite_report

ROOT = Path(__file__).resolve().parents[2]


def run_probe(
    *, ci: bool, fail: bool = False, only: str = "", basetemp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(LEVERS9_SUITE_PROBE="1", CI="true" if ci else "")
    if fail:
        env["LEVERS9_SUITE_PROBE_FAIL"] = "1"
    target = "tests/suite_probe.py" + (f"::{only}" if only else "")
    temp = ["--basetemp", str(basetemp)] if basetemp else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *temp, target],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_local_run_reports_skips_by_name_and_passes() -> None:
    result = run_probe(ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "levers9 suite: 4 ran, 2 skipped, 0 failed, 0 run again" in result.stdout
    assert "skipped tests/suite_probe.py::test_skipped_by_mark: probe skip in setup" in (
        result.stdout
    )
    assert "skipped tests/suite_probe.py::test_skipped_in_body: probe skip in the body" in (
        result.stdout
    )
    assert "CI:" not in result.stdout


def test_ci_run_fails_on_a_skip_not_allowed() -> None:
    result = run_probe(ci=True)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert "CI: 2 skipped test(s) not on tests/suite_report.py's ALLOWED_SKIPS" in result.stdout


def test_ci_run_without_skips_passes_and_a_failure_is_counted() -> None:
    clean = run_probe(ci=True, only="test_passes")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "levers9 suite: 1 ran, 0 skipped, 0 failed, 0 run again" in clean.stdout
    failing = run_probe(ci=True, fail=True, only="test_fails")
    assert failing.returncode == pytest.ExitCode.TESTS_FAILED
    assert "levers9 suite: 1 ran, 0 skipped, 1 failed, 0 run again" in failing.stdout


def test_a_failed_test_against_real_servers_runs_once_more_and_is_named(
    tmp_path: Path,
) -> None:
    once = run_probe(ci=True, fail=True, only="test_fails_once", basetemp=tmp_path / "once")
    assert once.returncode == 0, once.stdout + once.stderr
    assert "levers9 suite: 1 ran, 0 skipped, 0 failed, 1 run again" in once.stdout
    assert (
        "  run again tests/suite_probe.py::test_fails_once: first run"
        " AssertionError: probe first run"
    ) in once.stdout
    always = run_probe(ci=True, fail=True, only="test_fails_always", basetemp=tmp_path / "twice")
    assert always.returncode == pytest.ExitCode.TESTS_FAILED, always.stdout + always.stderr
    assert "levers9 suite: 1 ran, 0 skipped, 1 failed, 1 run again" in always.stdout


def test_allow_list_matches_by_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    tally = suite_report.Tally(skipped=[("tests/a.py::t1", "why"), ("tests/b.py::t2", "why")])
    monkeypatch.setattr(suite_report, "ALLOWED_SKIPS", {"tests/a.py": "a reason"})
    assert tally.disallowed() == [("tests/b.py::t2", "why")]
    lines = suite_report.summary_lines(tally, ci=True)
    assert lines[-1].startswith("CI: 1 skipped test(s)")
    assert suite_report.summary_lines(tally, ci=False)[-1] == "  skipped tests/b.py::t2: why"
