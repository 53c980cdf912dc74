"""`levers9 dev ...` run as a user runs it, in a home of its own with its own ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from levers9.cli.runtime import read_env_file
from tests.factories import free_port

BIN = Path(sys.executable).parent


class Dev:
    """Runs `levers9` in a state directory of its own, with its own ports."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.up_stdout = ""
        """What `levers9 dev up` printed (the fixture that ran it keeps it)."""
        self.ports = [
            "--temporal-port",
            str(free_port()),
            "--ui-port",
            str(free_port()),
            "--sandbox-port",
            str(free_port()),
            "--gateway-port",
            str(free_port()),
            "--ecr-port",
            str(free_port()),
            "--gar-port",
            str(free_port()),
            "--moto-port",
            str(free_port()),
            "--endpoints-port",
            str(free_port()),
        ]

    @property
    def env(self) -> dict[str, str]:
        return read_env_file(self.home / ".levers9" / "dev" / "env")

    def sourced(self, *argv: str) -> str:
        """A command run with this stack's env file sourced, as a user runs it; its stdout."""
        result = subprocess.run(
            list(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def kubectl(self, *args: str) -> str:
        return self.sourced("kubectl", *args)

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "levers9"), *args],
            cwd=self.home,
            env={**os.environ, "LEVERS9_HOME": str(self.home / ".levers9"), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def attach(self) -> subprocess.CompletedProcess[str]:
        """The README's attach of the demo pool (`make demo` runs it), after `. .levers9/dev/env`:
        until it runs, the dev pool's reconcile is refused (the spec's 403)."""
        script = Path(__file__).parents[1] / "deploy" / "gke" / "attach-gke-pool.sh"
        command = (
            f". {self.home / '.levers9' / 'dev' / 'env'} && {script} --project demo"
            " --zone us-central1-a --cluster demo --node-pool gpu-4x --gpu RTXPro6000"
        )
        env = {**os.environ, "LEVERS9_HOME": str(self.home / ".levers9")}
        env["LEVERS9"] = str(BIN / "levers9")
        env["PATH"] = f"{BIN}:{env['PATH']}"
        return subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=180
        )

    def temporal(self, *args: str) -> str:
        """The Temporal CLI on this stack's dev server."""
        return self.sourced(str(BIN / "temporal"), *args)

    def processes(self) -> list[dict[str, object]]:
        result = self.run("dev", "status", "-o", "json")
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, object]] = json.loads(result.stdout)
        return rows
