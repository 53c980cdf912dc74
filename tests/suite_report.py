"""The suite's own report: how many tests ran, skipped, failed and were run again, and CI's
rule on skips.

A test against real servers (marked `integration`) that fails is run once more
(pytest-rerunfailures, tests/conftest.py): it counts as failed only when it fails again, and the
report names every test that needed the second run, with its first failure's last line, so a
flaky test stays in sight.

A skip in CI hides what the run did not prove, so under `CI=true` a skipped test fails the run
unless its test id is on `ALLOWED_SKIPS` with the reason it cannot run there. Locally a skip is
reported by name at the end (a non-root `make test` skips the runc tests, and says so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

# Test id prefix -> why CI may skip it. Empty: every tool a skip waits for (root for runc, the
# older kubectl releases and gcloud under /usr/lib/google-cloud-sdk) is on the CI machine, so a
# skip there means something went missing. An entry needs a comment saying why it cannot run.
ALLOWED_SKIPS: dict[str, str] = {}

RERUNS = 1
"""How many more times a failed `integration` test runs."""
NOT_RERUN = ("tests/deploy/",)
"""Test id prefixes never run again: the image builds (a rerun is another build of minutes)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@dataclass
class Tally:
    ran: int = 0
    failed: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    rerun: list[tuple[str, str]] = field(default_factory=list)

    def record(self, report: pytest.TestReport) -> None:
        if str(report.outcome) == "rerun":  # pytest-rerunfailures: failed, run once more
            self.rerun.append((report.nodeid, first_line(report)))
            return
        if report.when == "call" and not report.skipped:
            self.ran += 1
        if report.failed:  # in the call, or an error in setup or teardown
            self.failed += 1
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append((report.nodeid, skip_reason(report)))

    def disallowed(self) -> list[tuple[str, str]]:
        return [
            (nodeid, reason)
            for nodeid, reason in self.skipped
            if not any(nodeid.startswith(prefix) for prefix in ALLOWED_SKIPS)
        ]


def first_line(report: pytest.TestReport) -> str:
    """The failure's first `E` line (what pytest says failed), clipped."""
    text = str(report.longrepr or "").strip()
    lines = [line.removeprefix("E").strip() for line in text.splitlines() if line.startswith("E ")]
    return (lines[0] if lines else text.splitlines()[-1] if text else "")[:200]


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


TALLY = Tally()


def summary_lines(tally: Tally, ci: bool) -> list[str]:
    lines = [
        f"levers9 suite: {tally.ran} ran, {len(tally.skipped)} skipped, {tally.failed} failed,"
        f" {len(tally.rerun)} run again"
    ]
    lines += [f"  skipped {nodeid}: {reason}" for nodeid, reason in tally.skipped]
    lines += [f"  run again {nodeid}: first run {why}" for nodeid, why in tally.rerun]
    bad = tally.disallowed()
    if ci and bad:
        lines.append(
            f"CI: {len(bad)} skipped test(s) not on tests/suite_report.py's ALLOWED_SKIPS:"
            " install what they need in .ci/run, or allow them there with the reason"
        )
    return lines
