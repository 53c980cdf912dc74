"""The controlplane runs on uvloop (levers9.process.run_loop), and such a process never spawns
through its loop: libuv forks, and gRPC's fork handlers crashed the children before their exec.
Every module the controlplane runs is checked for a spawn through the loop; the agents (which
keep asyncio's loop) and the CLI are not the controlplane."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOP_SPAWNS = {"create_subprocess_exec", "create_subprocess_shell", "subprocess_exec",
               "subprocess_shell"}  # fmt: skip


def _controlplane_sources() -> list[Path]:
    sources = [ROOT / "worker_main.py"]
    for package in ("levers9", "activities", "workflows"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(("levers9/worker/", "levers9/cli/")):
                continue
            sources.append(path)
    return sources


def _loop_spawns(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LOOP_SPAWNS
    ]


def test_the_controlplane_never_spawns_through_its_loop() -> None:
    sources = _controlplane_sources()
    assert any(p.name == "images.py" for p in sources)  # the skopeo copies are among them
    found = [spawn for path in sources for spawn in _loop_spawns(path)]
    assert found == [], f"spawn with levers9.process.run_command instead: {found}"


def test_the_check_finds_a_spawn_through_the_loop(tmp_path: Path) -> None:
    module = tmp_path / "spawns.py"
    module.write_text(
        "import asyncio\nasync def f():\n    await asyncio.create_subprocess_exec('skopeo')\n"
    )
    assert _loop_spawns(module, tmp_path) == ["spawns.py:3"]
