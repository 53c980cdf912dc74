"""Each runc task in a network namespace of its own (levers9.agent.task_network), with the real
runc, slirp4netns and nftables: a task reaches the internet (a listener in a namespace of this
test's own, routed from the node as the internet would be) and nothing of the node: not its
127.0.0.1, not its own address, not 169.254.169.254 (unless the pool allows it), not another
task's port; two tasks publishing one port on one worker both run and the agent reaches each
(port-forward, the readiness probe) whether it bound 127.0.0.1 or 0.0.0.0; the network goes with
the task, the sweep removes what an agent left, and an adopted network gets its slirp4netns back.
The rules themselves are pure and checked without root. Root only for the rest.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from levers9.agent import task_network
from levers9.agent.images import ImageCache
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import ContainerSpec
from levers9.agent.supervisor import TaskManager
from levers9.agent.task_network import TaskNetworks, parse_allow, ruleset
from levers9.agent.task_record import CONTAINER_READY
from levers9.proto import worker_pb2
from sandbox.registries import LocalRegistry
from tests.waiting import eventually

F = TypeVar("F", bound=Callable[..., Any])


def needs_root(test: F) -> F:
    """Real namespaces, runc, slirp4netns and nft: root, and the tools installed."""
    for mark in (
        pytest.mark.skipif(
            not (shutil.which("slirp4netns") and shutil.which("nft") and shutil.which("ip")),
            reason="deploy/dev/install-tools.sh installs slirp4netns and nftables",
        ),
        pytest.mark.skipif(os.geteuid() != 0, reason="runc and namespaces need root"),
        pytest.mark.integration,
    ):
        test = mark(test)
    return test


INTERNET = "198.51.100.2"
"""A listener's address in this test's own namespace, reached from the node through a veth
pair: an address of no private range that is not the node's, as the internet's are."""
METADATA = "169.254.169.254"
INTERNET_NAMESPACE = f"l9t-inet-{os.getpid()}"
ANSWER = (
    "import socket, sys\n"
    "server = socket.create_server(('0.0.0.0', int(sys.argv[1])))\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    conn, _ = server.accept()\n"
    "    conn.sendall(('reached ' + conn.getsockname()[0] + '\\n').encode())\n"
    "    conn.close()\n"
)
"""A listener that tells whoever connects which of its addresses they reached."""


# -- the rules (pure) ----------------------------------------------------------------------


def test_replies_pass_first_and_the_node_is_refused_before_any_allowed_cidr() -> None:
    rules = ruleset(
        parse_allow(["10.8.0.0/16", "fd12::/16"], "allow"),
        {ipaddress.ip_address("192.0.2.2"), ipaddress.ip_address("fd00::2")},
    ).splitlines()
    verdicts = [line.strip() for line in rules if "daddr" in line or "ct state" in line]
    assert verdicts[0] == "ct state established,related accept"
    assert verdicts[1].startswith("ip daddr 10.0.2.3 ")
    assert verdicts[1].endswith("accept")
    node = [i for i, v in enumerate(verdicts) if 'comment "node"' in v]
    allowed = [i for i, v in enumerate(verdicts) if v.endswith("counter accept")]
    refused = [i for i, v in enumerate(verdicts) if "reject" in v]
    assert [verdicts[i].split("{")[1].split("}")[0].strip() for i in node] == [
        "192.0.2.2",
        "fd00::2",
    ]
    assert [verdicts[i].split("{")[1].split("}")[0].strip() for i in allowed] == [
        "10.8.0.0/16",
        "fd12::/16",
    ]
    assert max(node) < min(allowed) < max(refused), "node refused, then allowed, then ranges"
    text = "\n".join(rules)
    for cidr in ("169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"):
        assert cidr in text
    for cidr in ("100.64.0.0/10", "127.0.0.0/8", "fc00::/7", "fe80::/10"):
        assert cidr in text


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "10.1.2.3/8", "model-store", "::1/129"])
def test_a_bad_cidr_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"^taskNetwork.allow: '{bad}' is not a CIDR"):
        parse_allow(f"192.168.0.0/16,{bad}", "taskNetwork.allow")


# -- the namespaces (root) -----------------------------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _listen(port: int, netns: str | None = None) -> subprocess.Popen[str]:
    enter = ["ip", "netns", "exec", netns] if netns else []
    process = subprocess.Popen(
        [*enter, sys.executable, "-c", ANSWER, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "up\n"
    return process


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        port: int = probe.getsockname()[1]
        return port


def _node_address() -> str:
    """An address of the node's own that is not loopback (the one a task would aim at)."""
    found = sorted(
        str(a)
        for a in task_network.node_addresses()
        if a.version == 4 and not a.is_loopback and str(a) != "198.51.100.1"
    )
    if not found:
        pytest.skip("this machine has no IPv4 address but loopback")
    return found[0]


@pytest.fixture(scope="module")
def internet() -> Iterator[int]:
    """A namespace of this test's own beyond a veth pair, holding INTERNET and METADATA, each
    answering on the port yielded; the node routes to both. Removed with everything in it."""
    name = INTERNET_NAMESPACE
    host_end = f"l9t-h{os.getpid() % 100000}"
    port = _free_port()
    _ip("netns", "add", name)
    listener = None
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "l9t-i", "netns", name)
        _ip("addr", "add", "198.51.100.1/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        inside = ("ip", "netns", "exec", name, "ip")
        for args in (
            ("addr", "add", f"{INTERNET}/24", "dev", "l9t-i"),
            ("addr", "add", f"{METADATA}/32", "dev", "l9t-i"),
            ("link", "set", "l9t-i", "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", "198.51.100.1"),
        ):
            subprocess.run([*inside, *args], check=True, capture_output=True)
        _ip("route", "add", f"{METADATA}/32", "via", INTERNET)
        listener = _listen(port, name)
        yield port
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "route", "del", f"{METADATA}/32"], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # the veth goes too


@pytest.fixture(scope="module")
def on_the_node() -> Iterator[int]:
    """A listener of the node's on every address (its 127.0.0.1 and its own), on the port
    yielded."""
    port = _free_port()
    listener = _listen(port)
    try:
        yield port
    finally:
        listener.kill()
        listener.wait()


def _runtime(
    image: tuple[LocalRegistry, str], tmp_path: Path, allow: tuple[str, ...] = ()
) -> RuncRuntime:
    work = tmp_path / "work"
    return RuncRuntime(
        ImageCache(tmp_path / "images", insecure=[image[0].address]),
        work / "runc",
        dev_root=tmp_path / "no-dev",
        cards=(),
        networks=TaskNetworks(work / "networks", allow=parse_allow(allow, "allow")),
    )


def _spec(tmp_path: Path, image: str, name: str, script: str) -> ContainerSpec:
    task = tmp_path / "tasks" / name
    return ContainerSpec(
        task_id=name,
        image=image,
        command=("sh", "-c", script),
        env={},
        gpu_indices=(),
        result_path=task / "result.json",
        work_dir=task / "work",
    )


def _tries(*targets: str) -> str:
    """A task's script: one line per `host:port`, what a connect there got."""
    return "; ".join(
        f'echo "{t} $(busybox nc -w 3 {t.replace(":", " ")} </dev/null 2>&1 | head -1)"'
        for t in targets
    )


async def _answers(runtime: RuncRuntime, spec: ContainerSpec) -> dict[str, str]:
    out = bytearray()
    container = await runtime.start(spec, out.extend)
    assert await asyncio.wait_for(container.wait(), 60) == 0, out.decode()
    return dict(line.split(" ", 1) for line in out.decode().splitlines())


@needs_root
async def test_a_task_reaches_the_internet_and_nothing_of_the_node(
    image: tuple[LocalRegistry, str],
    tmp_path: Path,
    internet: int,
    on_the_node: int,
) -> None:
    node = _node_address()
    with socket.create_connection((node, on_the_node), timeout=5) as control:
        assert control.recv(64).startswith(b"reached"), "the node's listener answers the node"
    targets = {
        "internet": f"{INTERNET}:{internet}",
        "metadata": f"{METADATA}:{internet}",
        "node": f"{node}:{on_the_node}",
        "node-loopback": f"127.0.0.1:{on_the_node}",
        "slirp-gateway": f"10.0.2.2:{on_the_node}",
    }
    runtime = _runtime(image, tmp_path)
    script = _tries(*targets.values()) + "; echo dns $(busybox grep nameserver /etc/resolv.conf)"
    answers = await _answers(runtime, _spec(tmp_path, image[1], "outbound", script))
    assert answers[targets["internet"]] == f"reached {INTERNET}"
    assert "No route to host" in answers[targets["metadata"]], answers
    assert "No route to host" in answers[targets["node"]], answers
    assert "Connection refused" in answers[targets["node-loopback"]], "its own loopback, empty"
    assert "reached" not in answers[targets["slirp-gateway"]], answers
    assert answers["dns"] == "nameserver 10.0.2.3"
    entered = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", INTERNET_NAMESPACE, "true"
    )
    assert await entered.wait() == 0, "the node's other namespaces (/run/netns) are still mounted"


@needs_root
async def test_a_cidr_the_pool_allows_is_reached(
    image: tuple[LocalRegistry, str], tmp_path: Path, internet: int
) -> None:
    runtime = _runtime(image, tmp_path, allow=(f"{METADATA}/32",))
    target = f"{METADATA}:{internet}"
    answers = await _answers(runtime, _spec(tmp_path, image[1], "allowed", _tries(target)))
    assert answers[target] == f"reached {METADATA}"


SERVE = (
    "mkdir -p /dev/shm/www && echo {name} > /dev/shm/www/index.html"
    " && exec busybox httpd -f -p {bind}:$PORT -h /dev/shm/www"
)


async def _get(tasks: TaskManager, task_id: str, port: int) -> str:
    reader, writer = await tasks.connect(task_id, port)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer.decode().rsplit("\r\n\r\n", 1)[-1].strip()


@needs_root
async def test_two_tasks_publish_one_port_and_neither_reaches_the_others(
    image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    port = _free_port()
    reports: list[worker_pb2.TaskStatus] = []
    tasks = TaskManager(_runtime(image, tmp_path), (), tmp_path / "work", reports.append)

    def serving(name: str, bind: str) -> worker_pb2.TaskSpec:
        return worker_pb2.TaskSpec(
            task_id=name,
            image=image[1],
            command=["sh", "-c", SERVE.format(name=name, bind=bind)],
            ports=[port],
            stop_grace_seconds=1,
        )

    try:
        await tasks.run(serving("any", "0.0.0.0"))
        await tasks.run(serving("loopback", "$LEVERS9_HOST"))

        async def both_ready() -> bool:
            phases = [[p.name for p in tasks.status(t).phases] for t in ("any", "loopback")]
            return all(CONTAINER_READY in p for p in phases)

        await eventually(both_ready, within=30)
        assert await _get(tasks, "any", port) == "any"
        assert await _get(tasks, "loopback", port) == "loopback"
        with pytest.raises(ConnectionRefusedError):  # nothing of theirs on the node
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        node = _node_address()
        script = _tries(f"127.0.0.1:{port}", f"{node}:{port}", f"10.0.2.100:{port}")
        await tasks.run(
            worker_pb2.TaskSpec(task_id="neighbour", image=image[1], command=["sh", "-c", script])
        )

        async def neighbour_ended() -> bool:
            return tasks.status("neighbour").state == worker_pb2.TASK_STATE_SUCCEEDED

        await eventually(neighbour_ended, within=60)
        tried = dict(line.split(" ", 1) for line in tasks.output("neighbour").tail().splitlines())
        assert len(tried) == 3, tried
        assert all("reached" not in t for t in tried.values()), tried
        assert "No route to host" in tried[f"{node}:{port}"], tried
    finally:
        await tasks.shutdown(grace_s=1)
    assert list((tmp_path / "work" / "networks").iterdir()) == [], "each network went with it"


@needs_root
async def test_the_sweep_removes_a_network_left_and_adopt_restarts_its_nat(
    tmp_path: Path,
) -> None:
    networks = TaskNetworks(tmp_path / "networks")
    left = await networks.create("left")
    kept = await networks.create("kept")
    slirp = task_network._slirp_alive(kept.netns.parent)
    assert slirp is not None
    os.kill(slirp, 9)

    async def gone() -> bool:
        return task_network._slirp_alive(kept.netns.parent) is None

    await eventually(gone, within=10)
    again = TaskNetworks(tmp_path / "networks")  # an agent started after this one
    adopted = await again.adopt("kept")
    assert adopted == kept
    assert task_network._slirp_alive(kept.netns.parent) not in (None, slirp)
    assert again.sweep(keep={"kept"}) == ["left"]
    assert not left.netns.parent.exists()
    assert str(left.netns) not in await asyncio.to_thread(Path("/proc/self/mountinfo").read_text)
    assert await again.adopt("left") is None
    again.remove("kept")
    assert list((tmp_path / "networks").iterdir()) == []


@needs_root
async def test_without_nat_tools_a_hand_built_runtime_gets_a_namespace_with_only_lo(
    tmp_path: Path,
) -> None:
    """The GPU check builds RuncRuntime by hand on a machine with neither slirp4netns nor nft
    (shared/gpu/harness.py): its tasks still get a namespace of their own, with only lo, as
    MACHINE.md's run on the H200 had (the agent itself refuses to start without them)."""
    networks = TaskNetworks(tmp_path / "networks", nft="/nonexistent/nft")
    network = await networks.create("bare")
    try:
        links = await _links(network.netns)
        assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
        assert task_network._slirp_alive(network.netns.parent) is None
        with_nat = await TaskNetworks(tmp_path / "nat").create("nat")
        assert "tap0" in await _links(with_nat.netns), (
            "with the tools the same call gives it its NAT"
        )
    finally:
        networks.remove("bare")
        TaskNetworks(tmp_path / "nat").remove("nat")


async def _links(netns: Path) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        ["nsenter", f"--net={netns}", "ip", "-o", "link"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout
