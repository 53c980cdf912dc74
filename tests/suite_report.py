"""The suite's own report: how many tests ran, skipped and failed, and CI's rule on skips.

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


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@dataclass
class Tally:
    ran: int = 0
    failed: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def record(self, report: pytest.TestReport) -> None:
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


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


TALLY = Tally()


def summary_lines(tally: Tally, ci: bool) -> list[str]:
    lines = [f"levers9 suite: {tally.ran} ran, {len(tally.skipped)} skipped, {tally.failed} failed"]
    lines += [f"  skipped {nodeid}: {reason}" for nodeid, reason in tally.skipped]
    bad = tally.disallowed()
    if ci and bad:
        lines.append(
            f"CI: {len(bad)} skipped test(s) not on tests/suite_report.py's ALLOWED_SKIPS:"
            " install what they need in .ci/run, or allow them there with the reason"
        )
    return lines
