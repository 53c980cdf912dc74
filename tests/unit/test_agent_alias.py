"""The agent's package is `levers9.agent`; `levers9.worker` is its old name, kept only as an alias
for the GPU check on the device machines (shared/gpu/harness.py imports the agent by it): the
same module objects under both names, and nothing in this repository uses the old one."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS_IMPORTS = (
    "levers9.worker.images",
    "levers9.worker.runtime",
    "levers9.worker.cdi",
    "levers9.worker.devices",
    "levers9.worker.driver",
    "levers9.worker.paths",
    "levers9.worker.smi",
    "levers9.worker.runc_runtime",
)


def test_the_old_name_gives_the_agents_own_modules() -> None:
    for old in HARNESS_IMPORTS:
        module = importlib.import_module(old)
        new = old.replace("levers9.worker", "levers9.agent", 1)
        assert module is sys.modules[new], old
        assert module.__spec__ is not None
        assert module.__spec__.name == new, "its own spec, not the alias's"
    from levers9.agent.images import PulledImage

    assert importlib.import_module("levers9.worker.images").PulledImage is PulledImage


def test_nothing_here_imports_the_agent_by_its_old_name() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    old = re.compile(r"^\s*(from|import)\s+levers9\.worker\b", re.MULTILINE)
    users = [p for p in tracked if (ROOT / p).is_file() and old.search((ROOT / p).read_text())]
    assert users == [], users
    assert "levers9.agent" in (ROOT / ".importlinter").read_text()
