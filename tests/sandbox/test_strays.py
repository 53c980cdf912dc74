"""`sandbox.strays` over a dev stack's state dir: a task a killed agent ran as its process is a
stray (with the stack down or up), removing it kills its process group; a running agent's work
dir holds none while the stack runs, and the agent itself is one once the stack is down; a task
network a killed agent left is one too (its slirp4netns killed, its namespace unmounted), so is
a gVisor sandbox of its runsc root (killed and deleted with runsc), and so is a task's root
mounted outside the work dir whose layers are in it (unmounted, its mount point removed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.agent.cgroups import TASK_ROOTS
from levers9.agent.process_runtime import start_ticks
from levers9.agent.task_network import TaskNetworks
from levers9.contract import AGENT_FILE, WORK_ROOT
from sandbox import strays


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A task's process, in a session of its own as the agent starts them."""
    process = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def _work_dir(state: Path, worker: str) -> Path:
    work = state / "nodes" / "node-a" / WORK_ROOT.lstrip("/") / worker
    (work / "processes").mkdir(parents=True)
    return work


def _record(work: Path, name: str, pid: int) -> None:
    kept = {"task_id": Path(name).stem, "pid": pid, "start": start_ticks(pid)}
    (work / name).write_text(json.dumps(kept))


def test_a_killed_agents_process_is_a_stray_and_removed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    work = _work_dir(tmp_path, "w1")
    _record(work, "processes/t1.json", sleeper.pid)
    found = strays.find(tmp_path, stack_running=True)
    assert [(s.kind, s.name, s.pid) for s in found] == [("process", "t1", sleeper.pid)]
    left = strays.remove(tmp_path, found, lambda _: None)
    assert left == []
    assert sleeper.wait(timeout=10) == -9
    assert strays.find(tmp_path, stack_running=False) == []


def test_a_running_agents_work_dir_holds_no_stray_while_the_stack_runs(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    work = _work_dir(tmp_path, "w1")
    _record(work, "processes/t1.json", sleeper.pid)
    _record(work, AGENT_FILE, os.getpid())  # this test stands in for the agent
    assert strays.find(tmp_path, stack_running=True) == []
    down = strays.find(tmp_path, stack_running=False)
    assert sorted((s.kind, s.pid) for s in down) == [
        ("agent", os.getpid()),
        ("process", sleeper.pid),
    ]


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="deploy/dev/install-tools.sh")
async def test_a_killed_agents_task_network_is_a_stray_and_removed(tmp_path: Path) -> None:
    work = _work_dir(tmp_path, "w1")
    network = await TaskNetworks(work / "networks").create("t1")
    slirp = json.loads((network.netns.parent / "slirp4netns.json").read_text())["pid"]
    found = strays.find(tmp_path, stack_running=True)
    assert sorted((s.kind, s.name) for s in found) == [
        ("mount", str(network.netns)),
        ("network", "t1"),
    ]
    assert [s.pid for s in found if s.kind == "network"] == [slirp]
    assert await asyncio.to_thread(strays.remove, tmp_path, found, lambda _: None) == []
    assert start_ticks(slirp) is None, "its slirp4netns is gone"
    assert strays.find(tmp_path, stack_running=False) == []


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="runsc needs root")
@pytest.mark.skipif(shutil.which("runsc") is None, reason="deploy/dev/install-tools.sh")
def test_a_killed_agents_gvisor_sandbox_is_a_stray_and_removed(tmp_path: Path) -> None:
    work = _work_dir(tmp_path, "w1")
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", bundle / "rootfs" / "bin" / "busybox")
    subprocess.run(["runsc", "spec", "--", "/bin/busybox", "sleep", "1000"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    runsc = ["runsc", "--root", str(work / "runsc"), "--network=none"]
    subprocess.run([*runsc, "run", "--detach", "--bundle", str(bundle), "l9-t1"], check=True)
    try:
        found = strays.find(tmp_path, stack_running=True)
        assert [(s.kind, s.name) for s in found if s.kind == "sandbox"] == [("sandbox", "l9-t1")]
        assert strays.remove(tmp_path, found, lambda _: None) == []
        listed = subprocess.run([*runsc, "list", "-q"], capture_output=True, text=True)
        assert listed.stdout.split() == [], "the sandbox is gone"
    finally:
        subprocess.run([*runsc, "delete", "--force", "l9-t1"], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting an overlay needs root")
def test_a_killed_agents_task_root_is_a_stray_and_removed(tmp_path: Path) -> None:
    """A task's root is mounted outside its work dir (TASK_ROOTS, levers9.agent.runc_runtime):
    it is found by its layers, under the stack's state dir, and goes with its mount point."""
    work = _work_dir(tmp_path, "w1")
    layers = work / "tasks" / "t1" / "bundle"
    for name in ("lower", "upper", "work"):
        (layers / name).mkdir(parents=True)
    point = TASK_ROOTS / f"test-{os.getpid()}-{tmp_path.name}"
    point.mkdir(parents=True)
    options = f"lowerdir={layers}/lower,upperdir={layers}/upper,workdir={layers}/work"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(point)], check=True)
    try:
        found = strays.find(tmp_path, stack_running=True)
        assert [(s.kind, s.name) for s in found] == [("mount", str(point))]
        assert strays.find(tmp_path / "nodes" / "node-b", stack_running=True) == [], "not theirs"
        assert strays.remove(tmp_path, found, lambda _: None) == []
        assert not point.exists(), "unmounted, and its mount point gone"
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        with contextlib.suppress(OSError):
            point.rmdir()
