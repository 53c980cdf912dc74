"""Spawning on uvloop (levers9.process.run_loop): libuv forks, and gRPC's fork handlers crashed
children forked while gRPC was busy, before their exec. The agents turn the handlers off
(levers9/__init__, imported before grpc) and spawn on uvloop; the controlplane, where
temporalio brings grpc in first, never spawns through its loop: every module it runs is
checked for a spawn through the loop (the agents and the CLI are not the controlplane)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


SPAWNS_UNDER_GRPC = """
import asyncio, json, sys
{first}
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from levers9.process import run_loop

async def main():
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{{port}}")
    stub = health_pb2_grpc.HealthStub(channel)
    calls, spawning = 0, True

    async def traffic():
        nonlocal calls
        while spawning:
            await stub.Check(health_pb2.HealthCheckRequest())
            calls += 1

    callers = [asyncio.create_task(traffic()) for _ in range(4)]
    codes = []
    for _ in range({spawns}):
        process = await asyncio.create_subprocess_exec("/bin/true")
        codes.append(await process.wait())
    spawning = False
    await asyncio.gather(*callers)
    await channel.close()
    await server.stop(None)
    loop = type(asyncio.get_running_loop()).__module__
    print(json.dumps({{"loop": loop, "codes": codes, "calls": calls}}))

run_loop(main(), spawns=True)
"""


def _spawns_under_grpc(first: str, spawns: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", SPAWNS_UNDER_GRPC.format(first=first, spawns=spawns)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def test_an_agent_spawns_on_uvloop_while_grpc_is_busy() -> None:
    """The agents' order (levers9 before grpc): uvloop, and every child execs. With gRPC's fork
    handlers on, 7 of 300 such children died (SIGSEGV, SIGABRT) before their exec here."""
    result = _spawns_under_grpc("import levers9", spawns=300)
    assert result["loop"].startswith("uvloop")
    assert result["calls"] > 0  # the children were forked while gRPC was in use
    assert result["codes"] == [0] * 300


def test_with_grpc_first_an_agent_keeps_asyncio_loop() -> None:
    result = _spawns_under_grpc("import grpc\nimport levers9", spawns=20)
    assert result["loop"] == "asyncio.unix_events"
    assert result["codes"] == [0] * 20
