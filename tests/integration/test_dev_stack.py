"""`levers9 dev up/status/down` as a user drives them: up starts the Temporal dev server and the
Temporal worker on the dev values and writes a sourceable env file; a second up changes nothing;
a taken port is named with who holds it; down leaves no process behind; the dev key never
reaches a log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.cli.runtime import read_env_file
from tests.factories import free_port

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


class Dev:
    """Runs `levers9` in a state directory of its own, with its own ports."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port())]

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "levers9"), *args],
            cwd=self.home,
            env={**os.environ, "LEVERS9_HOME": str(self.home / ".levers9"), **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def processes(self) -> list[dict[str, object]]:
        result = self.run("dev", "status", "-o", "json")
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, object]] = json.loads(result.stdout)
        return rows


def _dev_key(home: Path) -> dict[str, str]:
    """The service-account key `dev up` wrote into the private values file."""
    private = json.loads((home / ".levers9" / "dev" / "private.json").read_text())
    credentials = private["config"]["worker"]["pools"]["gke-rtx6000"]["kubernetes"]["credentials"]
    key: dict[str, str] = json.loads(credentials)
    return key


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    stack = Dev(tmp_path_factory.mktemp("dev"))
    up = stack.run("dev", "up", *stack.ports, env={"LEVERS9_RECONCILE_INTERVAL_SECONDS": "1"})
    assert up.returncode == 0, up.stdout + up.stderr
    yield stack
    stack.run("dev", "down")


def test_up_starts_both_and_writes_env(dev: Dev) -> None:
    rows = dev.processes()
    assert {(row["component"], row["state"]) for row in rows} == {
        ("temporal", "running"),
        ("worker", "running"),
    }
    env = read_env_file(dev.home / ".levers9" / "dev" / "env")
    assert env["TEMPORAL_ADDRESS"] == f"127.0.0.1:{dev.ports[1]}"
    assert env["LEVERS9_TEMPORAL_UI"] == f"http://127.0.0.1:{dev.ports[3]}"
    # The env file is what `temporal` needs too: the real CLI sees the dev pool's schedule.
    listed = subprocess.run(
        [str(BIN / "temporal"), "schedule", "list", "-o", "json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "reconcile:gke-rtx6000" in listed.stdout
    private = dev.home / ".levers9" / "dev" / "private.json"
    assert private.stat().st_mode & 0o777 == 0o600


def test_pool_list_reads_the_schedules(dev: Dev) -> None:
    result = dev.run("pool", "list", "-o", "json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)
    assert row["pool"] == "gke-rtx6000"
    assert row["every"] == "1s"


def test_second_up_changes_nothing(dev: Dev) -> None:
    before = {row["component"]: row["pid"] for row in dev.processes()}
    again = dev.run("dev", "up", *dev.ports)
    assert again.returncode == 0, again.stderr
    assert {row["component"]: row["pid"] for row in dev.processes()} == before
    assert "starting" not in again.stdout


def test_taken_port_is_named(dev: Dev, tmp_path: Path) -> None:
    other = Dev(tmp_path)
    result = other.run("dev", "up", "--temporal-port", dev.ports[1], "--ui-port", dev.ports[3])
    assert result.returncode == 1
    assert f"port {dev.ports[1]} on 127.0.0.1 is taken by pid" in result.stderr
    assert "--temporal-port" in result.stderr
    assert not _pids_mentioning(str(tmp_path))


def test_config_check_masks_the_key(dev: Dev) -> None:
    dev_dir = dev.home / ".levers9" / "dev"
    result = dev.run(
        "config", "check", "-f", str(dev_dir / "values.yaml"), "-f", str(dev_dir / "private.json")
    )
    assert result.returncode == 0, result.stderr
    assert "gke-rtx6000" in result.stdout
    assert "inline (**********)" in result.stdout
    key = _dev_key(dev.home)
    assert key["private_key_id"] not in result.stdout


def test_down_leaves_nothing_behind(tmp_path: Path) -> None:
    stack = Dev(tmp_path)
    assert stack.run("dev", "up", *stack.ports).returncode == 0
    pids = [int(str(row["pid"])) for row in stack.processes()]
    assert len(pids) == 2
    down = stack.run("dev", "down")
    assert down.returncode == 0, down.stderr
    assert "stopped: worker, temporal" in down.stdout
    assert not _pids_mentioning(str(tmp_path))
    assert "nothing is running" in stack.run("dev", "status").stdout
    logs = "".join(p.read_text() for p in (tmp_path / ".levers9" / "dev" / "logs").iterdir())
    secret_line = _dev_key(tmp_path)["private_key"].splitlines()[1]
    assert secret_line not in logs
    assert "loaded controller gpu_type=RTXPro6000 mode=external pool_name=gke-rtx6000" in logs
