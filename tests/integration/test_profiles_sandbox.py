"""The CLI picks its identity as kubectl picks a context, driven as a user drives it: the real
`levers9` in its own process, with a home of its own and nothing in its environment but where
that home is (no token, no gateway address, no dev stack's env file). `levers9 login` checks the
token with the controlplane's gateway and writes a 0600 profile, made current; a token the
gateway refuses writes nothing. `whoami` names the workspace (or the operator), the
controlplane and the token's label; `profile use` and `--profile` switch; `LEVERS9_TOKEN` (and
LEVERS9_API_TOKEN) beat the profile for one command; no output ever holds a token's secret.
`levers9 run`, `endpoint create` and `pool check` without `--pool` take the only pool.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.tokens import operator_token
from tests.controlplane import POOL, TOKEN_SECRET, Controlplane, reconciling, workers_available
from tests.factories import LEVERS9, run_levers9
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60
IDENTITY_VARIABLES = (
    "LEVERS9_TOKEN",
    "LEVERS9_API_TOKEN",
    "LEVERS9_API_TOKEN_FILE",
    "LEVERS9_GATEWAY_ADDRESS",
    "LEVERS9_GATEWAY_TLS",
    "LEVERS9_GATEWAY_TLS_CA_FILE",
    "LEVERS9_PROFILE",
)


@dataclass
class Team:
    cp: Controlplane
    token: str
    """team-a's token, labelled ci"""
    home: Path
    """LEVERS9_HOME of the user these tests are: its `config` is the profile file"""

    @property
    def config(self) -> Path:
        return self.home / "config"

    @property
    def gateway(self) -> str:
        return self.cp.settings.gateway_advertised_address

    def env(self, **extra: str) -> dict[str, str]:
        """The user's shell: its home, the controlplane's Temporal, nothing of its identity."""
        env = {k: v for k, v in self.cp.cli_env().items() if k not in IDENTITY_VARIABLES}
        return {**env, "LEVERS9_HOME": str(self.home), **extra}

    async def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return await run_levers9(self.env(**extra), *args)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _secret(token: str) -> str:
    return token.rsplit(".", 1)[-1]


@pytest.fixture(scope="module")
async def team(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Team]:
    async with reconciling(dev_env.client, tmp_path_factory.mktemp("profiles")) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        _ok(await plane.cli("workspace", "create", "team-a", "--gpu-quota", "2"))
        made = await plane.cli("workspace", "token", "create", "team-a", "--name", "ci")
        yield Team(plane, _ok(made).strip(), tmp_path_factory.mktemp("user") / ".levers9")


async def test_a_bad_token_is_refused_by_login_and_nothing_is_written(team: Team) -> None:
    forged = team.token.rsplit(".", 1)[0] + ".not-the-secret"
    done = await team.cli("login", "--token", forged, "--controlplane", f"http://{team.gateway}")
    assert done.returncode == 1
    assert "login refused" in done.stderr
    assert "UNAUTHENTICATED" in done.stderr
    assert f"{team.config} left as it was" in done.stderr
    assert "not-the-secret" not in done.stdout + done.stderr
    assert not team.config.exists()


async def test_login_with_a_workspace_token_writes_a_private_profile_made_current(
    team: Team,
) -> None:
    done = await team.cli(
        "login", "--token", team.token, "--controlplane", f"http://{team.gateway}",
        "--profile", "team-a",
    )  # fmt: skip
    said = _ok(done)
    assert f"logged in to {team.gateway} as workspace team-a (token ci)" in said
    assert "profile team-a" in said
    assert stat.S_IMODE(team.config.stat().st_mode) == 0o600
    assert _secret(team.token) not in said + done.stderr


async def test_whoami_names_the_workspace_the_controlplane_and_the_label(team: Team) -> None:
    done = await team.cli("whoami")
    lines = dict(line.split(":", 1) for line in _ok(done).splitlines())
    shown = {key.strip(): value.strip() for key, value in lines.items()}
    assert shown["workspace"] == "team-a"
    assert shown["controlplane"] == team.gateway
    assert shown["token"] == "ci"
    assert shown["profile"] == "team-a"
    as_json = json.loads(_ok(await team.cli("whoami", "-o", "json")))
    assert (as_json["workspace"], as_json["operator"], as_json["label"]) == ("team-a", False, "ci")
    assert _secret(team.token) not in done.stdout + done.stderr


async def test_a_bad_token_leaves_an_existing_file_as_it_was(team: Team) -> None:
    before = team.config.read_bytes()
    done = await team.cli("login", "--token", "not-a-token", "--profile", "other")
    assert done.returncode == 1
    assert "UNAUTHENTICATED" in done.stderr
    assert team.config.read_bytes() == before


async def test_profile_use_and_the_profile_option_switch_identity(team: Team) -> None:
    operator = operator_token(TOKEN_SECRET)
    # A bare host:port dials as the command dials now: this controlplane speaks no TLS.
    _ok(
        await team.cli(
            "login", "--token", operator, "--controlplane", team.gateway, "--profile", "ops"
        )
    )
    whoami = json.loads(_ok(await team.cli("whoami", "-o", "json")))
    assert (whoami["operator"], whoami["label"], whoami["profile"]) == (True, "operator", "ops")
    listed = await team.cli("profile", "list")
    rows = [line for line in _ok(listed).splitlines() if "ops" in line or "team-a" in line]
    assert len(rows) == 2
    assert any("*" in row and "ops" in row for row in rows)
    assert operator not in listed.stdout
    assert _secret(team.token) not in listed.stdout
    profiles = json.loads(_ok(await team.cli("profile", "list", "-o", "json")))
    assert [(p["name"], p["current"]) for p in profiles] == [("ops", True), ("team-a", False)]
    assert profiles[1]["token"] == team.token.rsplit(".", 1)[0] + ".***"
    assert profiles[0]["token"] == "***"

    said = _ok(await team.cli("profile", "use", "team-a"))
    assert "profile team-a is current" in said
    assert json.loads(_ok(await team.cli("whoami", "-o", "json")))["workspace"] == "team-a"
    once = json.loads(_ok(await team.cli("--profile", "ops", "whoami", "-o", "json")))
    assert once["operator"] is True
    assert json.loads(_ok(await team.cli("whoami", "-o", "json")))["workspace"] == "team-a"
    missing = await team.cli("profile", "use", "nobody")
    assert missing.returncode == 1
    assert "no profile nobody" in missing.stderr
    assert "ops, team-a" in missing.stderr


async def test_levers9_token_overrides_the_profile_for_one_command(team: Team) -> None:
    operator = operator_token(TOKEN_SECRET)
    for variable in ("LEVERS9_TOKEN", "LEVERS9_API_TOKEN"):
        once = json.loads(_ok(await team.cli("whoami", "-o", "json", **{variable: operator})))
        assert (once["operator"], once["profile"], once["token_from"]) == (
            True,
            "team-a",
            variable,
        )
    assert json.loads(_ok(await team.cli("whoami", "-o", "json")))["workspace"] == "team-a"
    noted = await team.cli("profile", "use", "team-a", LEVERS9_API_TOKEN=operator)
    _ok(noted)
    assert "note: LEVERS9_API_TOKEN set in this shell beats profile team-a" in noted.stderr
    assert operator not in noted.stdout + noted.stderr


async def test_a_profile_file_others_may_read_is_refused_naming_the_fix(team: Team) -> None:
    team.config.chmod(0o644)
    try:
        done = await team.cli("whoami")
        assert done.returncode == 1
        assert f"chmod 600 {team.config}" in done.stderr
    finally:
        team.config.chmod(0o600)


async def test_run_without_pool_runs_on_the_only_pool(team: Team) -> None:
    done = await team.cli("run", "--gpus", "0", "--detach", "--", "true")
    task_id = _ok(done).strip()
    got = json.loads(_ok(await team.cli("task", "get", task_id, "-o", "json")))
    assert (got["pool_name"], got["workspace"]) == (POOL, "team-a")


async def test_endpoint_create_without_pool_takes_the_only_pool(team: Team) -> None:
    done = await team.cli(
        "--profile", "ops", "endpoint", "create", "only-pool", "--port", "8080",
        "--", "python", "-c", "pass",
    )  # fmt: skip
    assert f"on pool {POOL}" in _ok(done)
    _ok(await team.cli("--profile", "ops", "endpoint", "delete", "only-pool"))


async def test_pool_check_without_pool_checks_the_only_pool(team: Team) -> None:
    """Only which pool it names is pinned here: the check's result is test_tasks_sandbox's."""
    done = await team.cli("--profile", "ops", "pool", "check", "--gpu", "RTXPro6000")
    assert done.stdout.startswith(f"GPU check on pool {POOL} (RTXPro6000)"), done.stderr


async def test_login_reads_the_token_from_stdin(team: Team) -> None:
    """`--token -`: the token stays out of the shell's history and the process list."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(LEVERS9), "login", "--token", "-", "--profile", "piped"],
        input=team.token + "\n",
        env=team.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "as workspace team-a (token ci)" in _ok(done)
    shown = json.loads(_ok(await team.cli("whoami", "-o", "json")))
    assert (shown["profile"], shown["workspace"]) == ("piped", "team-a")
    _ok(await team.cli("profile", "use", "team-a"))
