"""levers9 sets GRPC_EXPERIMENTS when it is imported (levers9/__init__ says why): gRPC's TCP then
runs on the core's iomgr path (tcp_posix) rather than the event engine's (posix_endpoint). The
core reads the setting when grpc is first imported, which the agents' and the CLI's order
(levers9 first) meets; with grpc first it is too late, and levers9 says so (GRPC_TUNED)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

A_CALL = """
import asyncio
{first}
import grpc
from grpc import aio
import levers9

async def main():
    server = aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with aio.insecure_channel(f"127.0.0.1:{{port}}") as channel:
        try:
            await channel.unary_unary("/levers9.Nothing/Here")(b"", timeout=5)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
    await server.stop(None)
    print("tuned", levers9.GRPC_TUNED)

asyncio.run(main())
"""


def _trace(first: str) -> tuple[str, str]:
    """The program's stdout, and which TCP code its gRPC core traced. A run whose trace holds
    no TCP line at all says nothing either way (seen once in a loaded full run): run again, up
    to three times."""
    for _ in range(3):
        said, paths = _trace_once(first)
        if paths:
            break
    return said, paths


def _trace_once(first: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    env |= {"GRPC_TRACE": "tcp", "GRPC_VERBOSITY": "debug"}
    done = subprocess.run(
        [sys.executable, "-c", A_CALL.format(first=first)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    paths = {name for name in ("tcp_posix", "posix_endpoint") if name in done.stderr}
    return done.stdout.strip(), ",".join(sorted(paths))


def test_levers9_first_puts_grpcs_tcp_on_the_iomgr_path() -> None:
    assert _trace("import levers9") == ("tuned True", "tcp_posix")


def test_grpc_first_is_too_late_and_levers9_says_so() -> None:
    assert _trace("") == ("tuned False", "posix_endpoint")
