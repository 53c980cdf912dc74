"""The agent's import contract (.importlinter) names every module of levers9 that is not shared
with the agent, so a new controlplane module is forbidden to the agent from the day it is added."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = frozenset(
    {
        "worker",
        "proto",
        "rpc",
        "tunnel",
        "contract",
        "logs",
        "process",
        "errors",
        "certificates",
        "image_reference",
    }
)
"""What the agent may import: itself, and what both sides speak."""


def _levers9_modules() -> set[str]:
    package = ROOT / "levers9"
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").exists()}


def test_the_agent_contract_forbids_every_controlplane_module() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = config["importlinter:contract:agent"]
    assert contract["source_modules"].split() == ["levers9.worker"]
    forbidden = set(contract["forbidden_modules"].split())
    named = {m.removeprefix("levers9.") for m in forbidden if m.startswith("levers9.")}
    assert {"workflows", "activities", "sandbox"} <= forbidden
    assert named.isdisjoint(SHARED)
    assert named | SHARED == _levers9_modules(), (
        "every levers9 module is either shared with the agent or forbidden to it: "
        f"unlisted {sorted(_levers9_modules() - named - SHARED)}"
    )
