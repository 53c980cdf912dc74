"""A box's checkpoint kept in a volume moves with it, on the sandbox's pool with real agents and
runsc, an S3 that checks credentials (moto, tests/buckets.py), through the CLI with a
workspace's token: a `--runtime runsc --checkpoints ckpt` box counting in its memory is stopped
(its image uploaded under the volume's `checkpoints/<name>/`, image.tar and its sha256), the
node that took it is cordoned and its worker's Job deleted, `box start` restores it on another
node (the image fetched there), and `box exec` reads the counter going on from where it was.
A box whose node is drained (cordoned) is checkpointed to its volume and started again on
another node by the controlplane, its counter going on; so is a task run with `--on-preempt
checkpoint --checkpoints ckpt`, its record showing the preempted attempt. `box start
--elsewhere` restores a box on another node (and is refused for a box whose node keeps its
checkpoint); `pool check --all --checkpoints ckpt` restores its box on another machine. A task
on a node whose spot VM's preemption is announced (`levers9 sandbox node preempt --notice`)
moves within the notice. `box delete` removes its image from the volume and the node that
fetched it, and says it stays on a node with no worker. The volume's key appears in no workflow
history of the controlplane's task queue.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.core.capacity import NODE_LABEL
from levers9.records.listing import list_worker_records
from levers9.temporal import connect
from tests.buckets import CheckingS3, checking_s3
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.reliability.secrets_scan import corpus_of_json
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90
TEAM = "movers"
BUCKET = "levers9-movers"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.5; done"


@dataclass
class Plane:
    cp: Controlplane
    s3: CheckingS3
    token: str

    async def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await self.cp.cli(*args, token=self.token)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Plane]:
    directory = tmp_path_factory.mktemp("box-move")
    runtimes = {"runtimes": ["runc", "runsc"]}
    with checking_s3(directory / "moto.log") as s3:
        s3.client().create_bucket(Bucket=BUCKET)
        credentials = directory / "team-credentials"
        credentials.write_text(
            f"[default]\naws_access_key_id = {s3.allowed.access_key_id}\n"
            f"aws_secret_access_key = {s3.allowed.secret_access_key}\n"
        )
        async with reconciling(
            dev_env.client, directory, pool_settings=runtimes, containers=True
        ) as cp:
            await eventually(lambda: workers_available(cp), within=WITHIN)
            _ok(await cp.cli("workspace", "create", TEAM))
            token = _ok(await cp.cli("workspace", "token", "create", TEAM)).strip()
            made = Plane(cp, s3, token)
            _ok(
                await made.cli(
                    *("volume", "create", "ckpt", "--bucket", f"s3://{BUCKET}/team"),
                    *("--endpoint", s3.endpoint, "--credentials-file", str(credentials)),
                )
            )
            yield made


async def _box(plane: Plane, name: str) -> dict[str, object]:
    shown: dict[str, object] = json.loads(_ok(await plane.cli("box", "get", name, "-o", "json")))
    return shown


async def _running(plane: Plane, name: str) -> dict[str, object]:
    async def running() -> bool:
        return (await _box(plane, name))["task_state"] == "running"

    await eventually(running, within=WITHIN)
    return await _box(plane, name)


async def _read(plane: Plane, name: str) -> int:
    done = await plane.cli("box", "exec", name, "--", "cat", "/tmp/count")
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0


async def _take_node_away(cp: Controlplane, node: str) -> None:
    """`kubectl cordon NODE` (no new worker there) and its worker's Job deleted; returns once
    its record has ended (placement has no worker there)."""
    await cp.kubectl("cordon", node)
    for job in await cp.worker_jobs():
        if job["metadata"]["labels"][NODE_LABEL] == node:
            await cp.kubectl("-n", job["metadata"]["namespace"], "delete", "job",
                             job["metadata"]["name"], "--wait=false")  # fmt: skip

    async def gone() -> bool:  # its record ended: placement offers no worker there
        live = await list_worker_records(cp.settings, POOL, include_ended=False)
        return all(r.node_name != node for r in live)

    await eventually(gone, within=WITHIN)


async def test_a_box_with_a_checkpoint_volume_is_restored_on_another_node(plane: Plane) -> None:
    create = ("box", "create", "mover", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    refused = await plane.cli(*create, "--checkpoints", "nosuch", "--", "sh", "-c", COUNTER)
    assert refused.returncode == 1
    assert "task.checkpoint_volume: no volume nosuch in workspace movers" in refused.stderr
    _ok(await plane.cli(*create, "--checkpoints", "ckpt", "--", "sh", "-c", COUNTER))
    before = await _running(plane, "mover")
    assert before["checkpoints"] == "ckpt", before

    async def counted() -> bool:
        return await _read(plane, "mover") >= 10

    await eventually(counted, within=WITHIN)
    first = await _read(plane, "mover")
    stopped = " ".join(_ok(await plane.cli("box", "stop", "mover")).split())
    assert "stopped (box stop; checkpointed to mover-1-" in stopped, stopped
    assert "kept in volume ckpt" in stopped, stopped
    assert "restores its processes on any machine of the pool" in stopped, stopped
    keys = [o["Key"] for o in plane.s3.client().list_objects_v2(Bucket=BUCKET)["Contents"]]
    [name] = {k.split("/")[2] for k in keys if k.startswith("team/checkpoints/")}
    assert sorted(k for k in keys if k.startswith(f"team/checkpoints/{name}/")) == [
        f"team/checkpoints/{name}/image.tar",
        f"team/checkpoints/{name}/image.tar.sha256",
    ]

    await _take_node_away(plane.cp, str(before["node"]))
    started = _ok(await plane.cli("box", "start", "mover"))
    assert f"its processes restored from checkpoint {name}" in started, started
    after = await _running(plane, "mover")
    assert after["node"] != before["node"], (before, after)
    # Each sandbox node keeps its own files: the image is on the new node because it was
    # fetched there from the volume.
    nodes = plane.cp.sandbox.state.dir / "nodes"
    fetched = list((nodes / str(after["node"])).glob(f"**/checkpoints/{TEAM}/{name}/manifest.json"))
    assert len(fetched) == 1, sorted(p.name for p in nodes.iterdir())

    resumed: list[int] = []

    async def answers() -> bool:
        resumed.append(await _read(plane, "mover"))
        return resumed[-1] > 0

    await eventually(answers, within=WITHIN)
    # Restored, not restarted: a fresh counter would read 1, 2, ... again.
    assert resumed[-1] >= first, (first, resumed)

    async def went_on() -> bool:
        return await _read(plane, "mover") > resumed[-1]

    await eventually(went_on, within=WITHIN)
    # `box delete` removes its image from the volume and from the node that fetched it; the
    # node that took it has no worker now: the image stays there, and the command says so.
    deleted = " ".join(_ok(await plane.cli("box", "delete", "mover")).split())
    assert f"checkpoint {name}: removed from volume ckpt" in deleted, deleted
    assert f"stays on node {before['node']} (its worker's checkpoints folder," in deleted
    assert "the node has no worker now; remove it there" in deleted, deleted
    assert f"removed from node {after['node']}" in deleted, deleted
    left = plane.s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"team/checkpoints/{name}/")
    assert left.get("Contents", []) == [], left
    assert list((nodes / str(after["node"])).glob(f"**/checkpoints/{TEAM}/{name}")) == []
    assert len(list((nodes / str(before["node"])).glob(f"**/checkpoints/{TEAM}/{name}"))) == 1


async def test_a_drained_box_with_a_checkpoint_volume_runs_again_elsewhere_by_itself(
    plane: Plane,
) -> None:
    """Its node cordoned (what `kubectl drain` does first): the drain checkpoints the box, its
    image goes to the volume, and the controlplane starts it again on another node, restored:
    nobody runs `box start`, and the counter goes on."""
    create = ("box", "create", "drained", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await plane.cli(*create, "--checkpoints", "ckpt", "--", "sh", "-c", COUNTER))
    before = await _running(plane, "drained")

    async def counted() -> bool:
        return await _read(plane, "drained") >= 10

    await eventually(counted, within=WITHIN)
    first = await _read(plane, "drained")
    node = str(before["node"])
    await plane.cp.kubectl("cordon", node)
    try:

        async def elsewhere() -> bool:
            shown = await _box(plane, "drained")
            return shown["task_state"] == "running" and shown["node"] not in ("", node)

        await eventually(elsewhere, within=WITHIN * 2, what="the box running on another node")
        after = await _box(plane, "drained")
        assert after["task"] != before["task"], (before, after)
        shown = _ok(await plane.cli("box", "get", "drained"))
        assert f"its node {node} is cordoned (drain); checkpointed to drained-1-" in " ".join(
            shown.split()
        ), shown
        resumed: list[int] = []

        async def went_on() -> bool:
            resumed.append(await _read(plane, "drained"))
            return resumed[-1] > first

        await eventually(went_on, within=WITHIN)
        assert min(r for r in resumed if r) >= first, (first, resumed)  # restored, not restarted
    finally:
        await plane.cp.kubectl("uncordon", node)
    _ok(await plane.cli("box", "delete", "drained"))


@dataclass
class CountingTask:
    """A `--on-preempt checkpoint --checkpoints ckpt` runsc task counting in its memory."""

    plane: Plane
    task_id: str

    @classmethod
    async def start(cls, plane: Plane) -> CountingTask:
        run = ("run", "--pool", POOL, "--gpus", "0", "--runtime", "runsc", "--detach")
        flags = ("--on-preempt", "checkpoint", "--checkpoints", "ckpt")
        made = cls(plane, _ok(await plane.cli(*run, *flags, "--", "sh", "-c", COUNTER)).split()[-1])

        async def counted() -> bool:
            return (await made.record())["state"] == "running" and await made.read() >= 10

        await eventually(counted, within=WITHIN)
        return made

    async def record(self) -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(
            _ok(await self.plane.cli("task", "get", self.task_id, "-o", "json"))
        )
        return shown

    async def read(self) -> int:
        done = await self.plane.cli("exec", self.task_id, "--", "cat", "/tmp/count")
        return int(done.stdout) if done.returncode == 0 and done.stdout.strip() else 0

    async def node(self) -> str:
        return str((await self.record())["node_name"])

    async def runs_elsewhere(self, node: str, within: float) -> dict[str, str]:
        """Once it runs on a node other than `node`: its one earlier attempt."""

        async def elsewhere() -> bool:
            now = await self.record()
            return now["state"] == "running" and now["node_name"] not in (None, "", node)

        await eventually(elsewhere, within=within, what="the task running on another node")
        attempts = (await self.record())["attempts"]
        assert len(attempts) == 1, attempts
        attempt: dict[str, str] = attempts[0]
        assert attempt["state"] == "preempted", attempt
        assert attempt["node_name"] == node, attempt
        assert f"checkpointed to {self.task_id}-ck1" in attempt["reason"], attempt
        return attempt

    async def counts_on_from(self, first: int) -> None:
        """Restored, not restarted: its count goes on from `first`."""
        resumed: list[int] = []

        async def went_on() -> bool:
            resumed.append(await self.read())
            return resumed[-1] > first

        await eventually(went_on, within=WITHIN)
        assert min(r for r in resumed if r) >= first, (first, resumed)


async def test_a_task_with_on_preempt_checkpoint_is_restored_elsewhere_when_drained(
    plane: Plane,
) -> None:
    """`levers9 run --on-preempt checkpoint --checkpoints ckpt` of a runsc task: its node
    cordoned, the drain's preemption checkpoints it to the volume instead of stopping it, and
    its next attempt restores it on another node: its counter goes on, and `task get` shows
    the preempted attempt with the checkpoint."""
    task = await CountingTask.start(plane)
    first, node = await task.read(), await task.node()
    await plane.cp.kubectl("cordon", node)
    try:
        attempt = await task.runs_elsewhere(node, WITHIN * 2)
        assert f"its node {node} is cordoned" in attempt["reason"], attempt
        await task.counts_on_from(first)
        shown = " ".join(_ok(await plane.cli("task", "get", task.task_id)).split())
        assert "on preempt: checkpoint" in shown, shown
        assert "1. preempted" in shown, shown
    finally:
        await plane.cp.kubectl("uncordon", node)
        await plane.cli("task", "cancel", task.task_id)


async def test_box_start_elsewhere_restores_on_another_node_and_needs_a_volume(
    plane: Plane,
) -> None:
    """`box start --elsewhere` of a box whose checkpoint is in its volume: restored on another
    node than the one that took it, counting on; of one whose checkpoint its node keeps: refused
    saying why, and it stays stopped."""
    create = ("box", "create", "roams", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await plane.cli(*create, "--checkpoints", "ckpt", "--", "sh", "-c", COUNTER))
    before = await _running(plane, "roams")

    async def counted() -> bool:
        return await _read(plane, "roams") >= 10

    await eventually(counted, within=WITHIN)
    first = await _read(plane, "roams")  # it counts on until the stop: restored, it is past this
    _ok(await plane.cli("box", "stop", "roams"))
    said = _ok(await plane.cli("box", "start", "roams", "--elsewhere"))
    assert "its processes restored from checkpoint roams-1-" in said, said
    after = await _running(plane, "roams")
    assert after["node"] != before["node"], (before, after)
    resumed: list[int] = []

    async def went_on() -> bool:
        resumed.append(await _read(plane, "roams"))
        return resumed[-1] > first

    await eventually(went_on, within=WITHIN)
    assert min(r for r in resumed if r) >= first, (first, resumed)
    _ok(await plane.cli("box", "delete", "roams"))

    create = ("box", "create", "stays", "--pool", POOL, "--gpus", "0", "--runtime", "runsc")
    _ok(await plane.cli(*create, "--", "sh", "-c", COUNTER))
    stays = await _running(plane, "stays")
    _ok(await plane.cli("box", "stop", "stays"))
    refused = await plane.cli("box", "start", "stays", "--elsewhere")
    assert refused.returncode == 1, refused.stdout
    assert "box stays cannot start elsewhere: its checkpoint stays-1-" in refused.stderr
    assert f"is kept on node {stays['node']} only" in " ".join(refused.stderr.split())
    assert (await _box(plane, "stays"))["state"] == "stopped"
    _ok(await plane.cli("box", "delete", "stays"))


async def test_pool_check_with_a_checkpoint_volume_restores_on_another_machine(
    plane: Plane,
) -> None:
    """`pool check --all --checkpoints ckpt` (the workspace's volume): the checkpoint restore's
    counting, serving box is started elsewhere than the machine that took its image."""
    done = await plane.cli(
        "pool", "check", "--pool", POOL, "--all", "--checkpoints", "ckpt", "--timeout", "5m"
    )
    shown = _ok(done)
    line = next(x for x in shown.splitlines() if "checkpoint restore" in x)
    assert line.startswith("ok"), shown + done.stderr
    assert "restored on another machine" in line, line
    assert "its URL answered before the stop and after the start" in line, line


async def test_a_spot_preemption_s_notice_moves_a_checkpointing_task_before_its_vm_goes(
    plane: Plane,
) -> None:
    """`levers9 sandbox node preempt NODE --notice 150` (GKE's impending-node-termination
    taint now, the machine gone at the notice's end): `machine list` says Preempting, the
    worker is drained as on a cordon, and a `--on-preempt checkpoint` task runs again on another
    node, restored and counting on, before its VM goes; then the node is gone. (Last of the
    module's tests that need nodes: the preempted one does not come back.)"""
    task = await CountingTask.start(plane)
    first, node = await task.read(), await task.node()
    state_dir = str(plane.cp.sandbox.state.dir)
    preempt = ("sandbox", "node", "preempt", node, "--notice", "150", "--state-dir", state_dir)
    said = _ok(await plane.cli(*preempt))
    assert f"node {node} preemption announced: its machine goes in 150s" in said

    async def preempting() -> bool:
        machines = json.loads(_ok(await plane.cli("machine", "list", "-o", "json")))
        return any(m["node_name"] == node and m["status"] == "Preempting" for m in machines)

    await eventually(preempting, within=WITHIN, what="machine list saying Preempting")
    attempt = await task.runs_elsewhere(node, 120)
    assert f"its node {node} is being preempted" in attempt["reason"], attempt
    nodes = (await plane.cp.kubectl("get", "nodes", "-o", "name")).split()
    assert f"node/{node}" in nodes, "moved within the notice, before its VM went"
    await task.counts_on_from(first)

    async def vm_gone() -> bool:
        return f"node/{node}" not in (await plane.cp.kubectl("get", "nodes", "-o", "name")).split()

    await eventually(vm_gone, within=200, what="the preempted node gone at its notice's end")
    assert (await task.record())["state"] == "running", "it runs on where it moved to"
    await plane.cli("task", "cancel", task.task_id)


async def test_the_volume_s_key_is_in_no_history(plane: Plane) -> None:
    """Its box's stop and start carried the volume's credentials to the agents (unsealed in
    the activities' calls), never in a history, memo or search attribute."""
    client = await connect(plane.cp.settings)
    query = f"TaskQueue='{plane.cp.settings.task_queue}'"
    texts, ids = [], []
    async for execution in client.list_workflows(query):
        ids.append(execution.id)
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        texts.append(corpus_of_json((await handle.fetch_history()).to_json()))
        texts.append(json.dumps(await execution.memo(), default=str))
        texts.append(str(execution.raw_info.search_attributes))
    corpus = "\n".join(texts)
    assert "box:movers:mover" in ids, "the box's workflows were listed"
    assert plane.s3.allowed.secret_access_key not in corpus
