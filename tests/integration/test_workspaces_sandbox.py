"""Two teams on one pool, driven by the real CLI as each team runs it: the operator makes
workspaces `team-a` and `team-b` and a token for each (`levers9 workspace ...`); team A runs a
serving task with its token. Team B's token, on that task, gets exactly what a missing task
gets from `task get`, `task logs`, `exec`, `port-forward` and `task cancel`, and nothing
changes (the task still runs, B's exec never ran in it); `task list` shows each team its own
tasks only; a workspace token on an operator command (`workspace list`, `workspace delete`) is
PERMISSION_DENIED naming the operator; `workspace delete` is refused while the workspace has a
running task; a revoked token is refused (UNAUTHENTICATED) within the cache's bound. Then no
token (operator or workspace) appears in any workflow history, memo or search attribute of the
controlplane, in its log lines, or in any Kubernetes object of the sandbox. Last, a team makes
and deletes its own endpoint with its token (`levers9 endpoint ...`), and another team's `get`
and `delete` of it answer as for a missing one. And a team reads the pools and machines with its
token, its own usage only in `pool get` and `workspace get`, and is refused `pool remove`.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from levers9.gateway.roles import TOKEN_CACHE_TTL_S
from levers9.providers.gke import remove_pool_workflow_id
from levers9.records.tasks import task_record
from levers9.temporal import connect
from levers9.tokens import operator_token
from tests.controlplane import POOL, TOKEN_SECRET, Controlplane, reconciling, workers_available
from tests.factories import HTTP_TASK, run_levers9
from tests.gateway.test_workspaces import decoded_history
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60
SLEEP_TASK = "import time; time.sleep(600)"


@dataclass
class Teams:
    cp: Controlplane
    a: str
    """team-a's token"""
    b: str
    """team-b's token"""
    task_a: str = ""
    """team-a's serving task"""


def _cells(line: str) -> list[str]:
    """A table row's cells (rich draws the columns apart with │)."""
    return [cell.strip() for cell in line.split("│")]


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def teams(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Teams]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("workspaces"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        tokens = []
        for team in ("team-a", "team-b"):
            _ok(await plane.cli("workspace", "create", team, "--gpu-quota", "2"))
            made = await plane.cli("workspace", "token", "create", team, "--name", "ci")
            tokens.append(_ok(made).strip())
            assert "shown once" in made.stderr
        yield Teams(plane, *tokens)


async def test_a_team_runs_with_its_token_and_its_task_carries_its_workspace(teams: Teams) -> None:
    cp = teams.cp
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--detach", "--port", "8080",
        "--", "python", "-c", HTTP_TASK,
        token=teams.a,
    )  # fmt: skip
    teams.task_a = _ok(done).strip()
    client = await connect(cp.settings)

    async def ready() -> bool:
        record = await task_record(client, teams.task_a)
        return record is not None and record.ready

    await eventually(ready, within=WITHIN)
    got = json.loads(_ok(await cp.cli("task", "get", teams.task_a, "-o", "json", token=teams.a)))
    assert got["workspace"] == "team-a"
    listed = [
        execution.id
        async for execution in client.list_workflows(
            f"Levers9Workspace='team-a' AND WorkflowType='TaskWorkflow'"
            f" AND TaskQueue='{cp.settings.task_queue}'"
        )
    ]
    assert listed == [f"task:{teams.task_a}"]
    shown = json.loads(_ok(await cp.cli("workspace", "get", "team-a", "-o", "json", token=teams.a)))
    assert (shown["gpu_quota"], shown["running_tasks"]) == (2, 1)


async def test_another_teams_task_answers_as_a_missing_one_and_nothing_changes(
    teams: Teams,
) -> None:
    cp, task = teams.cp, teams.task_a
    missing = f"t{uuid.uuid4().hex[:10]}"
    for command in (
        ["task", "get"],
        ["task", "logs"],
        ["task", "cancel"],
        ["exec", "{id}", "--", "touch", "/tmp/from-team-b"],
        ["port-forward", "{id}", "8080"],
    ):

        def args(task_id: str, command: list[str] = command) -> list[str]:
            if "{id}" in command:
                return [task_id if a == "{id}" else a for a in command]
            return [*command, task_id]

        theirs = await cp.cli(*args(task), token=teams.b)
        none = await cp.cli(*args(missing), token=teams.b)
        assert theirs.returncode == none.returncode == 1, command
        assert theirs.stdout == none.stdout.replace(missing, task), command
        assert theirs.stderr == none.stderr.replace(missing, task), command
        assert f"no task {task}" in theirs.stderr or "no running task" in theirs.stderr
    record = json.loads(_ok(await cp.cli("task", "get", task, "-o", "json", token=teams.a)))
    assert record["state"] == "running"
    assert "cancel" not in json.dumps(record["phases"])
    # B's exec never ran: the file it would have made is not there.
    absent = await cp.cli("exec", task, "--", "test", "-e", "/tmp/from-team-b", token=teams.a)
    assert absent.returncode == 1, absent.stdout + absent.stderr
    present = await cp.cli("exec", task, "--", "test", "-e", "/proc/self", token=teams.a)
    assert present.returncode == 0, present.stdout + present.stderr  # the check could pass


async def test_task_list_shows_each_team_its_own(teams: Teams) -> None:
    cp = teams.cp
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--", "echo", "b", token=teams.b
    )  # fmt: skip
    _ok(done)
    as_a = json.loads(_ok(await cp.cli("task", "list", "-o", "json", token=teams.a)))
    as_b = json.loads(_ok(await cp.cli("task", "list", "-o", "json", token=teams.b)))
    operator = json.loads(_ok(await cp.cli("task", "list", "-o", "json")))
    assert [r["task_id"] for r in as_a] == [teams.task_a]
    assert [r["workspace"] for r in as_b] == ["team-b"]
    assert sorted(r["workspace"] for r in operator) == ["team-a", "team-b"]


async def test_an_endpoint_of_a_workspace_answers_its_own_tokens_and_no_other(
    teams: Teams,
) -> None:
    """The operator makes team-a an endpoint (`--workspace team-a`): team-a's token and the
    operator's reach it; team-b's gets exactly what a missing endpoint gets (404), so names
    cannot be probed; its replica is team-a's task."""
    cp = teams.cp
    _ok(
        await cp.cli(
            "endpoint", "create", "chat-a", "--pool", POOL, "--gpus", "0", "--port", "8080",
            "--min-replicas", "1", "--workspace", "team-a", "--", "python", "-c", HTTP_TASK,
        )
    )  # fmt: skip
    base = cp.settings.endpoints_base_url()

    async def get(session: aiohttp.ClientSession, url: str, token: str) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(60)) as r:
            return r.status, await r.text()

    async with aiohttp.ClientSession() as session:
        own = await get(session, f"{base}/chat-a/hi", teams.a)
        assert own[0] == 200, own
        assert (await get(session, f"{base}/chat-a/hi", operator_token(TOKEN_SECRET)))[0] == 200
        theirs = await get(session, f"{base}/chat-a/hi", teams.b)
        missing = await get(session, f"{base}/chat-z/hi", teams.b)
    assert theirs[0] == missing[0] == 404
    assert theirs[1] == missing[1].replace("chat-z", "chat-a")
    replicas = json.loads(_ok(await cp.cli("task", "list", "-o", "json", token=teams.a)))
    assert [r["endpoint"] for r in replicas if r["endpoint"]] == ["chat-a"]
    _ok(await cp.cli("endpoint", "delete", "chat-a"))


async def test_a_workspace_token_on_an_operator_command_is_permission_denied(
    teams: Teams,
) -> None:
    cp = teams.cp
    for args in (
        ["workspace", "list"],
        ["workspace", "delete", "team-b"],
        ["workspace", "set", "team-a", "--gpu-quota", "64"],
        ["workspace", "token", "create", "team-a"],
    ):
        done = await cp.cli(*args, token=teams.a)
        assert done.returncode == 1, args
        assert "PERMISSION_DENIED" in done.stderr, args
        assert "operator" in done.stderr, args
    other = await cp.cli("workspace", "get", "team-b", token=teams.a)
    assert other.returncode == 1
    assert "NOT_FOUND: no workspace team-b" in other.stderr
    shown = json.loads(_ok(await cp.cli("workspace", "get", "team-a", "-o", "json")))
    assert shown["gpu_quota"] == 2  # the set above changed nothing


async def test_the_tables_show_workspaces_and_tokens(teams: Teams) -> None:
    cp = teams.cp
    table = _ok(await cp.cli("workspace", "list"))
    assert "GPU QUOTA" in table
    assert [_cells(line)[:2] for line in table.splitlines() if "team-" in line] == [
        ["team-a", "2"],
        ["team-b", "2"],
    ]
    tokens = _ok(await cp.cli("workspace", "token", "list", "team-a"))
    [row] = [_cells(line) for line in tokens.splitlines() if " ci " in line]
    assert row[2] == "live"
    assert teams.a not in tokens


async def test_a_workspace_with_a_running_task_is_not_deleted(teams: Teams) -> None:
    cp = teams.cp
    refused = await cp.cli("workspace", "delete", "team-a")
    assert refused.returncode == 1
    assert "has 1 running task(s): cancel them first" in refused.stderr
    listed = json.loads(_ok(await cp.cli("workspace", "list", "-o", "json")))
    assert [w["name"] for w in listed].count("team-a") == 1
    _ok(await cp.cli("task", "cancel", teams.task_a, token=teams.a))
    _ok(await cp.cli("workspace", "delete", "team-a"))
    after = json.loads(_ok(await cp.cli("workspace", "list", "-o", "json")))
    assert "team-a" not in [w["name"] for w in after]
    gone = await cp.cli("task", "list", token=teams.a)
    assert gone.returncode == 1
    assert "UNAUTHENTICATED" in gone.stderr


async def test_a_revoked_token_is_refused_within_the_bound(teams: Teams) -> None:
    cp = teams.cp
    tokens = json.loads(_ok(await cp.cli("workspace", "token", "list", "team-b", "-o", "json")))
    assert [t["label"] for t in tokens] == ["ci"]
    assert "last_used_at" in tokens[0]  # team B used it above
    _ok(await cp.cli("workspace", "token", "revoke", "team-b", tokens[0]["token_id"]))

    async def refused() -> bool:
        done = await cp.cli("task", "list", token=teams.b)
        return done.returncode == 1 and "revoked" in done.stderr

    await eventually(refused, within=TOKEN_CACHE_TTL_S + 10)
    done = await cp.cli("task", "list", token=teams.b)
    assert "UNAUTHENTICATED" in done.stderr
    assert teams.b not in done.stderr


async def test_no_token_is_in_any_history_memo_log_or_kubernetes_object(
    teams: Teams, log_lines: io.StringIO
) -> None:
    """Made and used while this test's log lines are captured, and by the tests before."""
    cp = teams.cp
    _ok(await cp.cli("workspace", "create", "team-c"))
    token_c = _ok(await cp.cli("workspace", "token", "create", "team-c")).strip()
    _ok(await cp.cli("run", "--pool", POOL, "--gpus", "0", "--", "true", token=token_c))
    secrets = {
        "operator": operator_token(TOKEN_SECRET),
        "team-a": teams.a,
        "team-b": teams.b,
        "team-c": token_c,
    }
    secrets.update({f"{name} secret": token.rsplit(".", 1)[1] for name, token in secrets.items()})
    del secrets["operator secret"]
    client = await connect(cp.settings)
    texts: dict[str, str] = {"log lines": log_lines.getvalue()}
    query = f"TaskQueue='{cp.settings.task_queue}'"
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        texts[f"history {execution.id}"] = decoded_history((await handle.fetch_history()).to_json())
        texts[f"memo {execution.id}"] = json.dumps(await execution.memo(), default=str)
        texts[f"search attributes {execution.id}"] = str(execution.typed_search_attributes)
    kinds = "secrets,configmaps,pods,jobs,deployments,serviceaccounts,events"
    texts["kubernetes objects"] = await cp.kubectl("get", kinds, "-A", "-o", "json")
    assert any(t.startswith("history workspace:team-c") for t in texts)  # the scan saw them
    assert len(texts["kubernetes objects"]) > 1000
    for where, text in texts.items():
        for name, secret in secrets.items():
            assert secret not in text, f"{name} token in {where}"


async def test_a_workspace_makes_and_manages_its_own_endpoints_and_no_others(
    teams: Teams,
) -> None:
    """`levers9 endpoint create|list|get|delete` with a workspace's token (LEVERS9_TOKEN, as a
    script sets it): team D's endpoint is D's (its --workspace implied) and listed to D only;
    team E's `get` and `delete` of it answer exactly as for a missing endpoint, and it stays;
    the operator sees it. (Workspaces of their own: team-a is deleted and team-b's token
    revoked by the tests above.)"""
    cp = teams.cp
    tokens = {}
    for team in ("team-d", "team-e"):
        _ok(await cp.cli("workspace", "create", team))
        tokens[team] = _ok(await cp.cli("workspace", "token", "create", team)).strip()

    listing = ("endpoint", "list", "-o", "json")

    async def as_team(team: str, *args: str) -> subprocess.CompletedProcess[str]:
        return await run_levers9({**cp.cli_env(), "LEVERS9_TOKEN": tokens[team]}, *args)

    async def listed(team: str | None) -> list[tuple[str, str]]:
        done = await (as_team(team, *listing) if team else cp.cli(*listing))
        return sorted((v["name"], v["spec"]["workspace"]) for v in json.loads(_ok(done)))

    created = _ok(
        await as_team(
            "team-d", "endpoint", "create", "ep-d", "--pool", POOL, "--gpus", "0",
            "--port", "8080", "--", "python", "-c", HTTP_TASK,
        )
    )  # fmt: skip
    assert "endpoint ep-d created: " in created
    assert "of workspace team-d" in created
    assert 'Bearer $LEVERS9_TOKEN"' in created  # the token as this command got it
    await eventually(lambda: _equal(listed("team-d"), [("ep-d", "team-d")]), within=WITHIN)
    assert ("ep-d", "team-d") in await listed(None)
    assert await listed("team-e") == []
    for command in (["endpoint", "get"], ["endpoint", "delete"]):
        theirs = await as_team("team-e", *command, "ep-d")
        none = await as_team("team-e", *command, "ep-nosuch")
        assert theirs.returncode == none.returncode == 1, command
        assert theirs.stdout == none.stdout.replace("ep-nosuch", "ep-d"), command
        assert theirs.stderr == none.stderr.replace("ep-nosuch", "ep-d"), command
        assert "no endpoint ep-d" in theirs.stderr
    # E's delete reaches E's own endpoint: the command could have deleted D's.
    _ok(
        await as_team(
            "team-e", "endpoint", "create", "ep-e", "--pool", POOL, "--gpus", "0",
            "--port", "8080", "--", "true",
        )
    )  # fmt: skip
    assert "endpoint ep-e deleted" in _ok(await as_team("team-e", "endpoint", "delete", "ep-e"))
    shown = json.loads(_ok(await as_team("team-d", "endpoint", "get", "ep-d", "-o", "json")))
    assert (shown["spec"]["workspace"], shown["deleted"]) == ("team-d", False)
    assert "endpoint ep-d deleted" in _ok(await as_team("team-d", "endpoint", "delete", "ep-d"))


async def _equal(got: Awaitable[list[tuple[str, str]]], wanted: list[tuple[str, str]]) -> bool:
    return await got == wanted


async def test_a_workspace_reads_pools_and_machines_and_its_own_usage_only(teams: Teams) -> None:
    """With a workspace's token: `pool list` and `machine list` show what the operator's do;
    `pool get` and `workspace get` show its own usage only (a card held, its quota), not the
    operator's task beside it; `pool remove` is PERMISSION_DENIED naming the operator, and the
    pool stays, no removal started. (Its default pool taken by `run` without --pool among two
    pools: tests/gateway/test_workspaces.py.)"""
    cp = teams.cp
    _ok(await cp.cli("workspace", "create", "team-f", "--gpu-quota", "1", "--default-pool", POOL))
    token = _ok(await cp.cli("workspace", "token", "create", "team-f")).strip()

    def names(rows: list[dict[str, Any]], key: str) -> list[str]:
        return sorted(row[key] for row in rows)

    pools = json.loads(_ok(await cp.cli("pool", "list", "-o", "json", token=token)))
    assert names(pools, "pool") == [POOL]
    assert pools[0]["schedule"] == f"reconcile:{POOL}"
    machines = json.loads(_ok(await cp.cli("machine", "list", "-o", "json", token=token)))
    operator_machines = json.loads(_ok(await cp.cli("machine", "list", "-o", "json")))
    assert names(machines, "node_name") == names(operator_machines, "node_name")
    assert len(machines) >= 1

    ours = _ok(
        await cp.cli(
            "run", "--gpus", "1", "--detach", "--", "python", "-c", SLEEP_TASK, token=token
        )
    ).strip()  # fmt: skip
    operators = _ok(
        await cp.cli(
            "run", "--pool", POOL, "--gpus", "0", "--detach", "--", "python", "-c", SLEEP_TASK
        )
    ).strip()  # fmt: skip
    client = await connect(cp.settings)

    async def both_running() -> bool:
        records = [await task_record(client, task_id) for task_id in (ours, operators)]
        return all(r is not None and r.state == "running" for r in records)

    await eventually(both_running, within=WITHIN)
    operator_view = json.loads(_ok(await cp.cli("pool", "get", POOL, "-o", "json")))
    rows = {row["workspace"]: row for row in operator_view["usage"]["workspaces"]}
    assert rows["team-f"]["gpus"] == 1
    assert rows["default"]["placed"] >= 1  # the operator's task, beside team-f's
    own_view = json.loads(_ok(await cp.cli("pool", "get", POOL, "-o", "json", token=token)))
    assert [
        (row["workspace"], row["gpus"], row["waiting"], row["gpu_quota"])
        for row in own_view["usage"]["workspaces"]
    ] == [("team-f", 1, 0, 1)]
    table = _ok(await cp.cli("pool", "get", POOL, token=token))
    assert "team-f" in table
    assert "default" not in table.split("usage by workspace")[1]
    shown = json.loads(_ok(await cp.cli("workspace", "get", "team-f", "-o", "json", token=token)))
    assert shown["default_pool"] == POOL
    assert [(p["pool"], p["gpus"], p["gpu_quota"]) for p in shown["pools"]] == [(POOL, 1, 1)]

    refused = await cp.cli("pool", "remove", "--pool", POOL, token=token)
    assert refused.returncode == 1
    assert "PERMISSION_DENIED" in refused.stderr
    assert "operator" in refused.stderr
    assert names(json.loads(_ok(await cp.cli("pool", "list", "-o", "json"))), "pool") == [POOL]
    with pytest.raises(RPCError) as absent:  # no removal was started
        await client.get_workflow_handle(remove_pool_workflow_id(POOL)).describe()
    assert absent.value.status == RPCStatusCode.NOT_FOUND
    for task_id in (ours, operators):
        _ok(await cp.cli("task", "cancel", task_id))
