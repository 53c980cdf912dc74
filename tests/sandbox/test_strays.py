"""`sandbox.strays` over a dev stack's state dir: a task a killed agent ran as its process is a
stray (with the stack down or up), removing it kills its process group; a running agent's work
dir holds none while the stack runs, and the agent itself is one once the stack is down."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.contract import AGENT_FILE, WORK_ROOT
from levers9.worker.process_runtime import start_ticks
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
