"""A pool name reaches a visibility query (machines, workers, tasks) only as a DNS label:
anything else is ValueError naming `pool`, raised before any connection (nothing answers at the
address here, so a listing that connected first would say unreachable instead), and `levers9
machine list` / `worker list` refuse it naming `--pool`, as `task list` does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from levers9 import logs
from levers9.cli.main import app
from levers9.config import ControlplaneSettings
from levers9.records.listing import list_machine_records, list_worker_records, pool_clause

BAD = ["Not_A_Pool", "gpu' OR PoolName!='x", "a'", "-a", "a" * 64, "a b"]
"""Not DNS labels: upper case, quotes and operators, a leading dash, 64 characters, a space."""


@pytest.fixture
def settings() -> ControlplaneSettings:
    """A controlplane nothing answers for."""
    return ControlplaneSettings.model_validate(
        {"temporalAddress": "127.0.0.1:1", "taskQueue": "levers9-records-test"}
    )


def test_a_dns_label_becomes_the_pool_clause_and_no_pool_lists_every_pool() -> None:
    assert pool_clause("gpu-a1") == " AND PoolName='gpu-a1'"
    assert pool_clause(None) == pool_clause("") == ""


@pytest.mark.parametrize("pool", BAD)
def test_a_pool_name_that_is_not_a_dns_label_is_refused_naming_pool(pool: str) -> None:
    with pytest.raises(ValueError, match=r"^pool: .* is not a pool name \(lowercase DNS label\)"):
        pool_clause(pool)


@pytest.mark.parametrize("pool", BAD[:2])
async def test_the_listings_refuse_it_before_they_connect(
    settings: ControlplaneSettings, pool: str
) -> None:
    with pytest.raises(ValueError, match=r"^pool: "):
        await list_machine_records(settings, pool)
    with pytest.raises(ValueError, match=r"^pool: "):
        await list_worker_records(settings, pool, include_ended=True)


@pytest.mark.parametrize("command", ["machine", "worker", "task"])
def test_the_list_commands_refuse_it_naming_the_option(command: str, tmp_path: Path) -> None:
    env = {"LEVERS9_HOME": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "200"}
    try:
        result = CliRunner().invoke(app, [command, "list", "--pool", "gpu' OR 'x"], env=env)
    finally:
        logs.setup("INFO", sys.stderr)  # the runner closes the stderr the CLI logged to
    assert result.exit_code == 2, result.output
    assert "--pool" in result.output
    assert "is not a pool name (lowercase DNS label)" in result.output
