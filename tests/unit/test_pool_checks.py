"""`levers9 pool check --all`'s output, without a controlplane: one aligned line per check (ok or
FAILED, its time, what it saw), the summary naming the failed checks, the JSON of `-o json`;
and `pool check` without `--gpu` or `--all` refused naming the option."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from levers9 import logs
from levers9.cli.main import app
from levers9.cli.pool_checks import NAMES, CheckResult, check_line, results_json, summary_line

RESULTS = [
    CheckResult("gpu check", True, 12.34, "1 x NVIDIA H200 on node-a, matmul ok"),
    CheckResult("checkpoint restore", False, 0.5, "box stop took no checkpoint: criu check failed"),
]


def test_a_line_has_the_status_the_name_the_time_and_the_detail() -> None:
    lines = [check_line(r) for r in RESULTS]
    assert lines == [
        "ok      gpu check             12.3s  1 x NVIDIA H200 on node-a, matmul ok",
        "FAILED  checkpoint restore     0.5s  box stop took no checkpoint: criu check failed",
    ]
    # Every check's time ends in the same column.
    assert {check_line(CheckResult(n, True, 1.0, "x")).index("s  x") for n in NAMES} == {34}


def test_the_summary_names_the_failed_checks() -> None:
    assert summary_line(RESULTS, "p") == "pool p: 1 of 2 checks failed (checkpoint restore)"
    assert summary_line(RESULTS[:1], "p") == "pool p: all 1 checks passed"


def test_json_has_each_check_and_whether_all_passed() -> None:
    shown = json.loads(results_json("p", RESULTS))
    assert shown["pool"] == "p"
    assert shown["ok"] is False
    assert shown["checks"][0] == {
        "check": "gpu check",
        "ok": True,
        "seconds": 12.3,
        "detail": "1 x NVIDIA H200 on node-a, matmul ok",
    }


def test_pool_check_without_gpu_or_all_names_the_option(tmp_path: Path) -> None:
    env = {"LEVERS9_HOME": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "200"}
    try:
        result = CliRunner().invoke(app, ["pool", "check", "--pool", "p"], env=env)
    finally:
        logs.setup("INFO", sys.stderr)  # the runner closes the stderr the CLI logged to
    assert result.exit_code == 2, result.output
    assert "--gpu" in result.output
    assert "e.g. --gpu H200" in result.output
