"""What a task's own network costs (levers9.agent.task_network), against host networking.

Two paths, each measured both ways (root; slirp4netns, nft and ip installed):

- **download**: a 1 GiB download from "the internet": a listener in a namespace of this
  script's own, beyond a veth pair (198.51.100.2, as in tests/agent/test_task_network.py).
  Host networking: the client in the node's namespace (the veth alone). Task network: the same
  client inside a task's namespace made by `TaskNetworks.create` (nft rules loaded, the
  packets through slirp4netns' user-mode NAT, then the veth): exactly where a runc task's
  process sits (runc only joins that namespace). Time to the first byte, and throughput.
- **published port**: 1,000 small requests (a line out, a line back) as the agent makes them
  for a port-forward: each on a new connection (connect, request, answer, close), and all on
  one kept connection. Host networking: the server on the node's 127.0.0.1 and the agent's
  `asyncio.open_connection`. Task network: the server on 127.0.0.1 of a task's namespace and
  `task_network.open_connection` (a thread enters the namespace to make the socket). p50, p95
  and the whole run. The gRPC hop of a real port-forward is the same on both paths and left out.

    sudo python benchmarks/task_network.py [--bytes 1073741824] [--requests 1000]

Everything it makes (namespaces, veth, route) is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from levers9.agent import task_network
from levers9.agent.task_network import TaskNetworks

INTERNET = "198.51.100.2"
SERVE = """
import socket, sys
mode, port = sys.argv[1], int(sys.argv[2])
server = socket.create_server((sys.argv[3], port), backlog=512)
print("up", flush=True)
chunk = memoryview(b"x" * (4 << 20))
while True:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode == "download":
        size = int(conn.makefile("rb").readline())
        while size > 0:
            size -= conn.send(chunk[: min(size, len(chunk))])
    else:
        reader = conn.makefile("rb")
        while line := reader.readline():
            conn.sendall(b"ok " + line)
    conn.close()
"""
DOWNLOAD = """
import socket, sys, time
size = int(sys.argv[3])
began = time.perf_counter()
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
conn.sendall(b"%d\\n" % size)
buffer = bytearray(4 << 20)
got = conn.recv_into(buffer)
first = time.perf_counter()
while got < size:
    n = conn.recv_into(buffer)
    if not n:
        break
    got += n
done = time.perf_counter()
print(f"{got} {first - began} {done - began}")
"""


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def internet_namespace() -> Iterator[str]:
    """A namespace beyond a veth pair holding INTERNET; its name."""
    name, host_end = f"l9b-inet-{os.getpid()}", f"l9b-h{os.getpid() % 100000}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "l9b-i", "netns", name)
        _run("ip", "addr", "add", "198.51.100.1/24", "dev", host_end)
        _run("ip", "link", "set", host_end, "up")
        for args in (
            ("addr", "add", f"{INTERNET}/24", "dev", "l9b-i"),
            ("link", "set", "l9b-i", "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", "198.51.100.1"),
        ):
            _run("ip", "netns", "exec", name, "ip", *args)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def serving(mode: str, port: int, bind: str, enter: list[str]) -> Iterator[None]:
    process = subprocess.Popen(
        [*enter, sys.executable, "-c", SERVE, mode, str(port), bind],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "up\n"
        yield
    finally:
        process.kill()
        process.wait()


def download(enter: list[str], port: int, size: int) -> dict[str, float]:
    out = subprocess.run(
        [*enter, sys.executable, "-c", DOWNLOAD, INTERNET, str(port), str(size)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    got, first, whole = int(out[0]), float(out[1]), float(out[2])
    assert got == size, f"got {got} of {size} bytes"
    return {
        "first_byte_ms": round(first * 1000, 2),
        "seconds": round(whole, 2),
        "MiB_per_s": round(size / whole / 2**20, 1),
    }


Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def requests(opener: Opener, count: int) -> dict[str, float]:
    """`count` requests each on a new connection, then `count` on one kept connection."""
    each = []
    began = time.perf_counter()
    for i in range(count):
        start = time.perf_counter()
        reader, writer = await opener()
        writer.write(b"%d\n" % i)
        assert await reader.readline() == b"ok %d\n" % i
        writer.close()
        each.append(time.perf_counter() - start)
    fresh_total = time.perf_counter() - began
    kept = []
    reader, writer = await opener()
    for i in range(count):
        start = time.perf_counter()
        writer.write(b"%d\n" % i)
        assert await reader.readline() == b"ok %d\n" % i
        kept.append(time.perf_counter() - start)
    writer.close()
    q = statistics.quantiles
    return {
        "new_connection_p50_ms": round(statistics.median(each) * 1000, 3),
        "new_connection_p95_ms": round(q(each, n=20)[18] * 1000, 3),
        "new_connection_total_s": round(fresh_total, 3),
        "kept_connection_p50_ms": round(statistics.median(kept) * 1000, 3),
        "kept_connection_p95_ms": round(q(kept, n=20)[18] * 1000, 3),
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        port: int = probe.getsockname()[1]
        return port


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    figures: dict[str, object] = {
        "nproc": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory() as state, internet_namespace() as internet:
        networks = TaskNetworks(Path(state) / "networks", node=())
        task = await networks.create("benchmark")
        enter_task = ["nsenter", f"--net={task.netns}"]
        try:
            port = _free_port()
            with serving("download", port, "0.0.0.0", ["ip", "netns", "exec", internet]):
                figures["download_host"] = download([], port, args.bytes)
                figures["download_task"] = download(enter_task, port, args.bytes)
            port = _free_port()
            with serving("echo", port, "127.0.0.1", []):
                figures["port_host"] = await requests(
                    lambda: asyncio.open_connection("127.0.0.1", port), args.requests
                )
            with serving("echo", port, "127.0.0.1", enter_task):
                figures["port_task"] = await requests(
                    lambda: task_network.open_connection(task.netns, port), args.requests
                )
        finally:
            networks.remove("benchmark")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root: it makes network namespaces")
    asyncio.run(main())
