"""Boxes end to end, on the sandbox's pool with containers (runc), through the CLI with a
workspace's token as a user drives it: `box create` with a counter and a web server on :8080;
`box list -o json` and `box get` show its running task; `box exec web -- sh -c 'exit 3'` exits 3
and `box exec` reads the counter; `box ports` prints the port's URL on the endpoints' front,
which answers the box's web server with the workspace's token (401 without one, 404 with another
workspace's, as for a missing box); another workspace's `box get`, `exec` and `stop` answer as
for a box that does not exist; `box ssh-proxy` carries stdin and stdout to a port; `box stop`
stops it (saying no checkpoint was taken) and refuses exec until `box start` starts a new task
with the same command and ports; `box delete` ends it. A `--runtime runsc` box running a counter
and a web server is checkpointed by `box stop` right after its URL answered, and restored by
`box start`: its count goes on and its URL answers again. `task checkpoint`
of a runsc counting task (a runc one is refused, and runs on; another workspace's is not found)
ends it with the checkpoint in its record, and `task restore` starts a task whose count goes on.
A box whose image was removed from its node reads stopped after `box start`, saying so; `task
checkpoint` of a box's task is refused naming `box stop`.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.core.boxes import KEEP_ALIVE
from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.factories import LEVERS9
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
BOX = (
    "mkdir -p /tmp/www && echo served-by-box > /tmp/www/index.html && cd /tmp/www"
    " && (python -m http.server 8080 >/dev/null 2>&1 &)"
    " && i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done"
)
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"


@dataclass
class Teams:
    cp: Controlplane
    tokens: dict[str, str]

    async def cli(self, team: str, *args: str) -> subprocess.CompletedProcess[str]:
        return await self.cp.cli(*args, token=self.tokens[team])


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def teams(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Teams]:
    runtimes = {"runtimes": ["runc", "runsc"]}  # runc the default; runsc boxes checkpoint
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("boxes"), pool_settings=runtimes, containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        tokens = {}
        for team in ("boxers", "others"):
            _ok(await plane.cli("workspace", "create", team))
            made = await plane.cli("workspace", "token", "create", team, "--name", "ci")
            tokens[team] = _ok(made).strip()
        yield Teams(plane, tokens)


async def _box(teams: Teams, name: str) -> dict[str, object]:
    shown: dict[str, object] = json.loads(
        _ok(await teams.cli("boxers", "box", "get", name, "-o", "json"))
    )
    return shown


async def _running(teams: Teams, name: str) -> dict[str, object]:
    async def running() -> bool:
        return (await _box(teams, name))["task_state"] == "running"

    await eventually(running, within=WITHIN)
    return await _box(teams, name)


async def _count(teams: Teams) -> int:
    return int(_ok(await teams.cli("boxers", "box", "exec", "web", "--", "cat", "/tmp/count")))


async def test_a_box_runs_its_task_and_execs_with_the_exit_status(teams: Teams) -> None:
    create = ("box", "create", "web", "--pool", POOL, "--gpus", "0", "--port", "8080")
    made = _ok(await teams.cli("boxers", *create, "--", "sh", "-c", BOX))
    assert "box web created in workspace boxers" in made, made
    box = await _running(teams, "web")
    assert (box["state"], box["workspace"], box["ports"]) == ("running", "boxers", "8080")
    listed = json.loads(_ok(await teams.cli("boxers", "box", "list", "-o", "json")))
    assert [(b["name"], b["task"]) for b in listed] == [("web", box["task"])]
    failed = await teams.cli("boxers", "box", "exec", "web", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3, (failed.stderr, await _box(teams, "web"))

    async def counting() -> bool:
        return await _count(teams) >= 2

    await eventually(counting, within=WITHIN)


async def test_a_box_is_refused_at_create_naming_the_field(teams: Teams) -> None:
    create = ("box", "create", "--pool", POOL, "--gpus", "0")
    again = await teams.cli("boxers", *create, "web")
    assert again.returncode == 1
    assert "box web exists already in workspace boxers" in again.stderr, again.stderr
    theirs = await teams.cli("boxers", *create, "spy", "--workspace", "others")
    assert theirs.returncode == 1
    assert "PERMISSION_DENIED" in theirs.stderr, theirs.stderr
    assert "acts on its own workspace's boxes only, not on workspace 'others'" in theirs.stderr
    disk = await teams.cli("boxers", *create, "nodisk", "--disk", "nosuch:/home")
    assert disk.returncode == 1
    assert "task.mounts: no disk nosuch in workspace boxers" in disk.stderr, disk.stderr
    idle = await teams.cli("boxers", *create, "idle", "--idle-stop", "10s")
    assert idle.returncode == 2
    assert "10 s is not between 60 s and 30 days" in idle.stderr, idle.stderr
    listed = json.loads(_ok(await teams.cp.cli("box", "list", "-o", "json")))
    assert [(b["name"], b["workspace"]) for b in listed] == [("web", "boxers")]


async def test_box_ports_url_answers_the_box_s_web_server_for_its_workspace_only(
    teams: Teams,
) -> None:
    shown = _ok(await teams.cli("boxers", "box", "ports", "web"))
    [url] = re.findall(r"^8080: (\S+)$", shown, re.M)
    box = await _box(teams, "web")
    assert f"levers9 port-forward {box['task']} :8080" in shown, shown
    async with aiohttp.ClientSession() as session:

        async def get(token: str | None, at: str = url) -> tuple[int, str]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.get(at, headers=headers) as response:
                return response.status, await response.text()

        async def served() -> bool:
            return await get(teams.tokens["boxers"]) == (200, "served-by-box\n")

        await eventually(served, within=WITHIN)
        assert (await get(None))[0] == 401
        status, text = await get(teams.tokens["others"])
        assert (status, text) == (404, "no box web: `levers9 box list` shows them\n")
        missing = await get(teams.tokens["boxers"], url.replace("/web/", "/nosuch/"))
        assert missing == (404, "no box nosuch: `levers9 box list` shows them\n")


async def test_ssh_proxy_carries_stdin_and_stdout_to_the_box_s_port(teams: Teams) -> None:
    """What OpenSSH's ProxyCommand does with it, with the box's web server in place of an sshd:
    the bytes on stdin reach the port and its answer comes back on stdout."""
    env = {**teams.cp.cli_env(), "LEVERS9_API_TOKEN": teams.tokens["boxers"]}
    done = await asyncio.to_thread(
        subprocess.run,
        [str(LEVERS9), "box", "ssh-proxy", "web", "--port", "8080"],
        input=b"GET / HTTP/1.0\r\n\r\n",
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"HTTP/1.0 200"), done.stdout
    assert done.stdout.endswith(b"\r\n\r\nserved-by-box\n"), done.stdout
    refused = await teams.cli("boxers", "box", "ssh-proxy", "web")
    assert refused.returncode == 1
    assert "does not publish port 22: create it with --port 22" in refused.stderr


async def test_another_workspace_s_box_is_not_found_as_a_missing_one(teams: Teams) -> None:
    for args in (("get", "web"), ("exec", "web", "--", "true"), ("stop", "web")):
        theirs = await teams.cli("others", "box", *args)
        missing = await teams.cli("others", "box", args[0], "nosuch", *args[2:])
        assert theirs.returncode == missing.returncode == 1, theirs.stderr
        assert "no box web" in theirs.stderr, theirs.stderr
        assert theirs.stderr.replace("web", "X") == missing.stderr.replace("nosuch", "X")
    assert json.loads(_ok(await teams.cli("others", "box", "list", "-o", "json"))) == []
    assert (await _box(teams, "web"))["state"] == "running"


async def test_task_checkpoint_of_a_box_s_task_is_refused_naming_box_stop(teams: Teams) -> None:
    """The box would read its task's end as its own, the checkpoint unknown to `box start`."""
    box = await _box(teams, "web")
    refused = await teams.cli("boxers", "task", "checkpoint", str(box["task"]))
    assert refused.returncode == 1, refused.stdout
    assert f"task {box['task']} is box web's: `levers9 box stop web` checkpoints it" in " ".join(
        refused.stderr.split()
    ), refused.stderr
    assert (await _box(teams, "web"))["task"] == box["task"], "it runs on"
    assert (await _box(teams, "web"))["task_state"] == "running"


async def test_stop_and_start_run_a_new_task_with_the_same_command_and_ports(
    teams: Teams,
) -> None:
    before = await _box(teams, "web")
    stopped = _ok(await teams.cli("boxers", "box", "stop", "web"))
    assert "stopped (box stop; no checkpoint" in stopped, stopped
    # A runc box's worker was asked and refused: its words say why.
    flat = " ".join(stopped.split())  # the console wraps long lines
    assert "the worker took none:" in flat, stopped
    assert "runs under runc, whose checkpoint needs CRIU" in flat, stopped
    refused = await teams.cli("boxers", "box", "exec", "web", "--", "true")
    assert refused.returncode == 1
    assert "levers9 box start web" in refused.stderr, refused.stderr
    client = await connect(teams.cp.settings)

    async def cancelled() -> bool:
        record = await task_record(client, str(before["task"]))
        return record is not None and record.state == "cancelled"

    await eventually(cancelled, within=WITHIN)
    started = _ok(await teams.cli("boxers", "box", "start", "web"))
    assert "box web starting: task web-2-" in started, started
    after = await _running(teams, "web")
    assert after["task"] != before["task"]
    assert after["starts"] == 2
    assert (after["command"], after["ports"]) == (before["command"], before["ports"])
    # Without a checkpoint the counter starts again (the box's processes start fresh).
    assert await _count(teams) < 100


async def test_a_box_without_a_command_keeps_running_until_stopped(teams: Teams) -> None:
    _ok(await teams.cli("boxers", "box", "create", "plain", "--pool", POOL, "--gpus", "0"))
    box = await _running(teams, "plain")
    assert box["command"] == ["sh", "-c", KEEP_ALIVE[2]], box
    assert _ok(await teams.cli("boxers", "box", "exec", "plain", "--", "echo", "up")) == "up\n"
    _ok(await teams.cli("boxers", "box", "delete", "plain"))
    client = await connect(teams.cp.settings)

    async def ended() -> bool:
        record = await task_record(client, str(box["task"]))
        return record is not None and record.state == "cancelled"

    await eventually(ended, within=WITHIN)
    record = await task_record(client, str(box["task"]))
    assert record is not None
    # Its keep-alive exits 0 on SIGTERM (137 would be the SIGKILL after the grace).
    assert record.exit_code == 0, record


async def test_delete_ends_the_box_and_its_task(teams: Teams) -> None:
    box = await _box(teams, "web")
    _ok(await teams.cli("boxers", "box", "delete", "web"))
    assert json.loads(_ok(await teams.cli("boxers", "box", "list", "-o", "json"))) == []
    client = await connect(teams.cp.settings)

    async def ended() -> bool:
        record = await task_record(client, str(box["task"]))
        return record is not None and record.state == "cancelled"

    await eventually(ended, within=WITHIN)


async def test_stop_checkpoints_a_runsc_box_and_start_restores_its_processes(
    teams: Teams,
) -> None:
    """`box stop` of a `--runtime runsc` box with a web server on :8080 and a counter
    checkpoints its task right after its URL answered; `box start` restores it: the counter in
    its memory-backed /tmp goes on from where it was, and the URL answers again."""
    create = ("box", "create", "counter", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await teams.cli("boxers", *create, "--port", "8080", "--", "sh", "-c", BOX))
    before = await _running(teams, "counter")
    [url] = re.findall(
        r"^8080: (\S+)$", _ok(await teams.cli("boxers", "box", "ports", "counter")), re.M
    )
    headers = {"Authorization": f"Bearer {teams.tokens['boxers']}"}

    async def served() -> bool:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers) as response,
        ):
            return (response.status, await response.text()) == (200, "served-by-box\n")

    async def read() -> int:
        done = await teams.cli("boxers", "box", "exec", "counter", "--", "cat", "/tmp/count")
        return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0

    async def counted() -> bool:
        return await read() >= 10

    await eventually(counted, within=WITHIN)
    await eventually(served, within=WITHIN)
    first = await read()
    # At once after a request: the server closed that connection first, so it lingers in the
    # sandbox; gVisor saves it because the relay made it a loopback one.
    stopped = _ok(await teams.cli("boxers", "box", "stop", "counter"))
    assert "stopped (box stop; checkpointed to counter-1-" in stopped, stopped
    client = await connect(teams.cp.settings)
    record = await task_record(client, str(before["task"]))
    assert record is not None
    assert record.state == "cancelled", record
    assert "checkpointed to counter-1-" in record.reason, record
    started = _ok(await teams.cli("boxers", "box", "start", "counter"))
    assert "its processes restored from checkpoint counter-1-" in started, started
    after = await _running(teams, "counter")
    assert after["task"] != before["task"]
    # The image is on the node that took it: the restore is pinned there.
    assert after["node"] == before["node"], (before, after)

    resumed: list[int] = []

    async def answers() -> bool:
        resumed.append(await read())
        return resumed[-1] > 0

    await eventually(answers, within=WITHIN)
    # Restored, not restarted: a fresh counter would read 1, 2, ... again.
    assert resumed[-1] >= first, (first, resumed)

    async def went_on() -> bool:
        return await read() > first

    await eventually(went_on, within=WITHIN)
    await eventually(served, within=WITHIN)
    _ok(await teams.cli("boxers", "box", "delete", "counter"))


async def test_a_box_whose_checkpoint_image_is_gone_says_so_and_starts_fresh(
    teams: Teams,
) -> None:
    """Its image removed from the node after `box stop` (a wiped disk, say): `box start`'s
    restore fails, the box reads stopped saying its processes are lost, and the next start is
    fresh; `box delete` then finds none on the node."""
    create = ("box", "create", "lost", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await teams.cli("boxers", *create, "--", "sh", "-c", COUNTER))
    before = await _running(teams, "lost")
    stopped = " ".join(_ok(await teams.cli("boxers", "box", "stop", "lost")).split())
    [name] = re.findall(r"checkpointed to (lost-1-[0-9a-f]+)", stopped)
    nodes = teams.cp.sandbox.state.dir / "nodes"
    [image] = list((nodes / str(before["node"])).glob(f"**/checkpoints/boxers/{name}"))
    shutil.rmtree(image)
    _ok(await teams.cli("boxers", "box", "start", "lost"))

    async def stopped_again() -> bool:
        return (await _box(teams, "lost"))["state"] == "stopped"

    await eventually(stopped_again, within=WITHIN)
    reason = " ".join(str((await _box(teams, "lost"))["reason"]).split())
    assert f"its checkpoint {name} could not be restored" in reason, reason
    assert f"no checkpoint {name} on this machine" in reason, reason
    assert "its processes are lost; levers9 box start lost starts it fresh" in reason, reason
    started = _ok(await teams.cli("boxers", "box", "start", "lost"))
    assert "restored from checkpoint" not in started, started
    await _running(teams, "lost")
    deleted = " ".join(_ok(await teams.cli("boxers", "box", "delete", "lost")).split())
    assert f"checkpoint {name}: node {before['node']} held none" in deleted, deleted


async def _task_state(teams: Teams, task_id: str) -> dict[str, object]:
    shown: dict[str, object] = json.loads(
        _ok(await teams.cli("boxers", "task", "get", task_id, "-o", "json"))
    )
    return shown


async def _task_count(teams: Teams, task_id: str) -> int:
    done = await teams.cli("boxers", "exec", task_id, "--", "cat", "/tmp/count")
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0


async def _task_counting(teams: Teams, *runtime: str) -> str:
    run = ("run", "--detach", "--pool", POOL, "--gpus", "0", *runtime)
    task_id = _ok(await teams.cli("boxers", *run, "--", "sh", "-c", COUNTER)).strip()

    async def counting() -> bool:
        return await _task_count(teams, task_id) >= 3

    await eventually(counting, within=WITHIN)
    return task_id


async def test_task_checkpoint_of_a_runc_task_is_refused_and_it_runs_on(teams: Teams) -> None:
    task_id = await _task_counting(teams)
    refused = await teams.cli("boxers", "task", "checkpoint", task_id)
    flat = " ".join(refused.stderr.split())
    assert refused.returncode == 1, refused.stdout
    assert f"task {task_id} not checkpointed:" in flat, flat
    assert "runs under runc, whose checkpoint needs CRIU" in flat, flat
    assert "the task runs on" in flat, flat
    record = await _task_state(teams, task_id)
    assert (record["state"], record["checkpoints"]) == ("running", []), record
    _ok(await teams.cli("boxers", "task", "cancel", task_id))


async def test_task_checkpoint_ends_a_runsc_task_and_task_restore_goes_on_counting(
    teams: Teams,
) -> None:
    task_id = await _task_counting(teams, "--runtime", "runsc")
    theirs = await teams.cli("others", "task", "checkpoint", task_id)
    missing = await teams.cli("others", "task", "checkpoint", "nosuchtask")
    assert theirs.returncode == missing.returncode == 1
    assert f"no task {task_id}" in theirs.stderr, theirs.stderr
    assert theirs.stderr.replace(task_id, "X") == missing.stderr.replace("nosuchtask", "X")

    async def counted() -> bool:
        return await _task_count(teams, task_id) >= 10

    await eventually(counted, within=WITHIN)
    first = await _task_count(teams, task_id)
    name = f"{task_id}-ck1"
    taken = _ok(await teams.cli("boxers", "task", "checkpoint", task_id))
    flat = " ".join(taken.split())
    assert f"task {task_id} checkpointed to {name} (" in flat, taken
    record = await _task_state(teams, task_id)
    assert f"on node {record['node_name']}" in flat, taken
    assert f"kept on node {record['node_name']} only" in flat, taken
    assert f"task {task_id} is cancelled: checkpointed to {name}" in flat, taken
    assert (record["state"], record["reason"]) == ("cancelled", f"checkpointed to {name}")
    kept: dict[str, object]
    [kept] = record["checkpoints"]  # type: ignore[misc]
    assert (kept["name"], kept["node"], kept["stored"]) == (name, record["node_name"], "")

    spied = await teams.cli("others", "task", "restore", name)
    assert spied.returncode == 1
    assert f"no checkpoint {name}" in spied.stderr, spied.stderr
    restored = await teams.cli("boxers", "task", "restore", name)
    assert restored.returncode == 0, restored.stderr
    assert f"restoring {name} pinned to node {record['node_name']}" in restored.stderr
    new_id = restored.stdout.strip()
    assert new_id, restored.stdout
    assert new_id != task_id

    resumed: list[int] = []

    async def answers() -> bool:
        resumed.append(await _task_count(teams, new_id))
        return resumed[-1] > 0

    await eventually(answers, within=WITHIN)
    # Restored, not restarted: a fresh counter would read 1, 2, ... again.
    assert resumed[-1] >= first, (first, resumed)

    async def went_on() -> bool:
        return await _task_count(teams, new_id) > first

    await eventually(went_on, within=WITHIN)
    again = await _task_state(teams, new_id)
    assert (again["state"], again["node_name"]) == ("running", record["node_name"]), again
    _ok(await teams.cli("boxers", "task", "cancel", new_id))
