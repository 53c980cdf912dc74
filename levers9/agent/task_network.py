"""Each task's network: a network namespace of its own, its way out, and the agent's way in.

Per task (`TaskNetworks.create`), under the agent's work dir (`networks/<digest>/`, so an agent
started after this one finds it again: `adopt`, `sweep`):

- a network namespace, kept by a bind mount of its nsfs file (`netns`), which the task's
  container joins (levers9.agent.runc_config) instead of the agent's;
- nftables rules inside it (`ruleset`), loaded before anything runs there: replies to what the
  task opened pass (`ct state established,related`, first, so the agent's connections to its
  ports work), its own loopback passes, slirp's DNS (10.0.2.3:53) passes, the CIDRs the pool
  allows (`taskNetwork.allow`) pass, then the node's own addresses (every address of the
  agent's interfaces, and the node's IP) are refused, then link-local (169.254/16, fe80::/10:
  no metadata server), the private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7)
  and 127/8 on the way out. Refused, not dropped: a connect fails at once (`No route to host`)
  instead of hanging to its timeout. The node's addresses stay refused even inside an allowed
  CIDR (a cluster's model store is allowed; its kubelet on this node is not);
- `slirp4netns` (user-mode NAT, no privilege over the node's network: the task's packets leave
  as the slirp process's own connections) for outbound access, started with
  `--disable-host-loopback` (10.0.2.2 is not the node's 127.0.0.1) and its own sandbox and
  seccomp filter, in a session of its own (it outlives an agent that is SIGKILLed, as the
  containers do); `resolv.conf` names slirp's DNS, the node's search domains kept.

The agent reaches a task's published ports from inside its namespace (`open_connection`):
a socket belongs to the namespace it was created in, so a thread of its own enters the
task's namespace (libc `setns`: Python 3.11 has no os.setns), creates the socket and leaves;
the connect and the traffic then run on the event loop as any other. Nothing else reaches a
task's ports: the namespace has no route in, and slirp forwards none.

Teardown (`remove`, at the container's end and by the sweep) kills slirp4netns, detaches the
namespace's mount and removes the folder; the namespace goes with its last user.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from levers9.agent.id_ranges import NamespaceError, make_namespaces
from levers9.agent.process_runtime import start_ticks
from levers9.agent.runtime import StartError
from levers9.logs import get_logger

log = get_logger("levers9.agent")

TAP = "tap0"
MTU = 65520
DNS = "10.0.2.3"
"""slirp4netns' DNS forwarder, inside its default 10.0.2.0/24."""
TASK_LOOPBACK = "127.0.0.1"
"""Where the agent dials a task's port inside its namespace: a task that binds 127.0.0.1 or
0.0.0.0 is reached there."""
READY_WITHIN_S = 10.0
CLONE_NEWNET = 0x40000000
MNT_DETACH = 2

_LIBC = ctypes.CDLL(None, use_errno=True)
"""libc's setns and umount2, which Python 3.11's os lacks."""

LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
PRIVATE = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "fc00::/7",
)
"""Refused on the way out unless the pool allows them (127/8 never leaves through the tap:
the task's own loopback is `lo`)."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class NetworkError(StartError):
    """The task's network could not be made; the message says what failed."""


def parse_allow(value: str | Iterable[str], field: str) -> tuple[Network, ...]:
    """The CIDRs of a pool's `taskNetwork.allow` (a comma-separated string, or a list);
    ValueError naming `field` and the CIDR when one is not a network."""
    items = value.split(",") if isinstance(value, str) else list(value)
    networks = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError as error:
            raise ValueError(
                f"{field}: {item!r} is not a CIDR ({error}); write a network such as 10.8.0.0/16"
            ) from None
    return tuple(networks)


def ruleset(allow: Sequence[Network], node: Collection[Address]) -> str:
    """The nftables rules of a task's namespace (see the module's docstring; pure)."""
    lines = [
        "table inet levers9 {",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        "    ct state established,related accept",
        '    oifname "lo" accept',
        f"    ip daddr {DNS} meta l4proto {{ tcp, udp }} th dport 53 accept",
    ]

    def refuse(what: str, given: Iterable[Network | Address]) -> None:
        targets = list(given)
        for family, version in (("ip", 4), ("ip6", 6)):
            chosen = sorted({str(t) for t in targets if t.version == version})
            if chosen:
                lines.append(
                    f"    {family} daddr {{ {', '.join(chosen)} }} counter"
                    f' reject with icmpx type admin-prohibited comment "{what}"'
                )

    refuse("node", node)
    for family, version in (("ip", 4), ("ip6", 6)):
        allowed = sorted({str(n) for n in allow if n.version == version})
        if allowed:
            lines.append(f"    {family} daddr {{ {', '.join(allowed)} }} counter accept")
    refuse("link-local", (ipaddress.ip_network(n) for n in LINK_LOCAL))
    refuse("private", (ipaddress.ip_network(n) for n in PRIVATE))
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def node_addresses(proc: Path = Path("/proc")) -> set[Address]:
    """Every address of the interfaces of the agent's network namespace (the node's, on the
    host network): the kernel's local routes (`net/fib_trie`) and IPv6 addresses
    (`net/if_inet6`)."""
    found: set[Address] = set()
    with contextlib.suppress(OSError):
        last = ""
        for line in (proc / "net/fib_trie").read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "|--":
                last = words[1]
            elif words[:3] == ["/32", "host", "LOCAL"] and last:
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.ip_address(last))
    with contextlib.suppress(OSError):
        for line in (proc / "net/if_inet6").read_text().splitlines():
            words = line.split()
            if words and len(words[0]) == 32:
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.IPv6Address(int(words[0], 16)))
    return found


def resolv_conf(host: Path = Path("/etc/resolv.conf")) -> str:
    """The task's resolv.conf: slirp's DNS, with the node's search domains and options."""
    kept: list[str] = []
    with contextlib.suppress(OSError):
        kept = [
            line
            for line in host.read_text().splitlines()
            if line.split()[:1] in (["search"], ["domain"], ["options"])
        ]
    return "\n".join([f"nameserver {DNS}", *kept, ""])


@dataclass(frozen=True)
class TaskNetwork:
    """One task's network, as its container needs it."""

    task_id: str
    netns: Path
    """The namespace's nsfs bind mount: the container joins it by this path."""
    resolv_conf: Path

    @property
    def userns(self) -> Path:
        """The task's user namespace, which owns the network namespace when `create` was given
        the task's ids (levers9.agent.id_ranges.make_namespaces): the container joins both."""
        return self.netns.with_name("userns")


class TaskNetworks:
    """The task networks of this agent (see the module's docstring)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        allow: Sequence[Network] = (),
        node: Collection[str] = (),
        slirp4netns: str = "slirp4netns",
        nft: str = "nft",
        host_resolv_conf: Path = Path("/etc/resolv.conf"),
    ) -> None:
        """`node`: addresses of the node besides those of the agent's interfaces (its IP,
        when the agent runs on the pod network)."""
        self._state = state_dir
        self._allow = tuple(allow)
        self._node: set[Address] = set()
        for address in node:
            with contextlib.suppress(ValueError):  # a name, not an address: nothing to refuse
                self._node.add(ipaddress.ip_address(address))
        self._slirp4netns, self._nft = slirp4netns, nft
        self._host_resolv = host_resolv_conf
        self._slirps: dict[str, asyncio.subprocess.Process] = {}
        state_dir.mkdir(parents=True, exist_ok=True)

    def folder(self, task_id: str) -> Path:
        # Named by a digest: a task id is the controlplane's, whatever it holds.
        return self._state / hashlib.sha256(task_id.encode()).hexdigest()[:16]

    def network(self, task_id: str) -> TaskNetwork:
        folder = self.folder(task_id)
        return TaskNetwork(task_id, folder / "netns", folder / "resolv.conf")

    async def create(self, task_id: str, user_ids: tuple[int, int] | None = None) -> TaskNetwork:
        """The task's namespace, its rules, slirp4netns running for it. NetworkError.
        `user_ids` (the node's first id and how many): the namespace is made in a user
        namespace of those ids (`TaskNetwork.userns`), for a container of that range."""
        self.remove(task_id)  # what a task of the same id left (a retried start)
        network = self.network(task_id)
        folder = network.netns.parent
        folder.mkdir(parents=True)
        (folder / "task_id").write_text(task_id)
        network.resolv_conf.write_text(resolv_conf(self._host_resolv))
        network.netns.touch()
        try:
            if user_ids is None:
                await _run("unshare", f"--net={network.netns}", "true")
            else:
                try:
                    await make_namespaces(network.userns, network.netns, *user_ids)
                except NamespaceError as error:
                    raise NetworkError(f"the task's network: {error}") from None
            missing = [t for t in (self._nft, self._slirp4netns) if shutil.which(t) is None]
            if missing:
                # Only where the runtime is built by hand (the GPU check on a bare machine):
                # the agent refuses to start without them (levers9.agent.runtimes).
                log.warning(
                    "task network without outbound access",
                    task_id=task_id,
                    missing=",".join(missing),
                    why="only lo in the task's namespace",
                )
                return network
            rules = ruleset(self._allow, node_addresses() | self._node)
            await _run("nsenter", f"--net={network.netns}", self._nft, "-f", "-", stdin=rules)
            await self._slirp(network)
        except BaseException:
            self.remove(task_id)
            raise
        return network

    async def adopt(self, task_id: str) -> TaskNetwork | None:
        """The network an agent before this one made for the task, its slirp4netns started
        again if it has gone; None when there is none (its namespace is not mounted)."""
        network = self.network(task_id)
        if not _is_mounted_namespace(network.netns):
            return None
        if _slirp_alive(network.netns.parent) is None:
            log.warning("task network restarted", task_id=task_id, why="slirp4netns had gone")
            try:
                await self._slirp(network)
            except NetworkError as error:  # its ports are still the agent's to dial
                log.error("task network without its way out", task_id=task_id, error=str(error))
        return network

    def remove(self, task_id: str) -> None:
        """Kills the task's slirp4netns and removes its namespace and folder (done when there
        are none)."""
        folder = self.folder(task_id)
        started = self._slirps.pop(task_id, None)
        if started is not None and started.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                started.kill()
        _remove(folder)

    def sweep(self, keep: Collection[str]) -> list[str]:
        """Removes every task network of this agent's folder but those of the tasks in
        `keep`; the ids of their tasks (the folder's name where its task id is unreadable)."""
        kept = {self.folder(t) for t in keep}
        swept = []
        for folder in sorted(p for p in self._state.iterdir() if p.is_dir()):
            if folder in kept:
                continue
            try:
                task_id = (folder / "task_id").read_text()
            except OSError:
                task_id = folder.name
            self._slirps.pop(task_id, None)
            _remove(folder)
            log.warning("task network swept", task_id=task_id)
            swept.append(task_id)
        return swept

    async def _slirp(self, network: TaskNetwork) -> None:
        folder = network.netns.parent
        ready_read, ready_write = os.pipe()
        try:
            with (folder / "slirp4netns.log").open("ab") as errors:
                process = await asyncio.create_subprocess_exec(
                    # A private mount namespace of its own: slirp's sandbox detaches the root
                    # it leaves, which on a shared mount (/run/netns, say) would unmount the
                    # node's own namespaces' bind mounts too. unshare execs it (same pid).
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    self._slirp4netns,
                    "--configure",
                    f"--mtu={MTU}",
                    "--disable-host-loopback",
                    "--enable-sandbox",
                    "--enable-seccomp",
                    f"--ready-fd={ready_write}",
                    "--netns-type=path",
                    str(network.netns),
                    TAP,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=(ready_write,),
                    # Its own session: the agent's end (a SIGKILL to its group) is not its end.
                    start_new_session=True,
                )
        except FileNotFoundError:
            os.close(ready_read)
            raise NetworkError("unshare (util-linux) is not installed on this worker") from None
        finally:
            os.close(ready_write)
        self._slirps[network.task_id] = process
        (folder / "slirp4netns.json").write_text(
            json.dumps({"pid": process.pid, "start": start_ticks(process.pid)})
        )
        try:
            # Its write end closes when it exits: the read returns then, ready or not.
            async with asyncio.timeout(READY_WITHIN_S):
                ready = await asyncio.to_thread(os.read, ready_read, 1)
        except TimeoutError:
            ready = b""
        finally:
            os.close(ready_read)
        if ready != b"1":
            process.kill()
            said = (folder / "slirp4netns.log").read_text(errors="replace").strip().splitlines()
            raise NetworkError(
                f"slirp4netns did not configure the task's network{': ' + said[-1] if said else ''}"
            )


async def open_connection(
    network: Path, port: int, host: str = TASK_LOOPBACK
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to `host:port` inside the namespace at `network`. OSError."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[socket.socket] = loop.create_future()

    def settle(outcome: socket.socket | BaseException) -> None:
        if isinstance(outcome, BaseException):
            if not made.cancelled():
                made.set_exception(outcome)
        elif made.cancelled():
            outcome.close()
        else:
            made.set_result(outcome)

    def enter() -> None:
        outcome: socket.socket | BaseException
        try:
            outcome = _socket_in(network)
        except BaseException as error:  # handed to the awaiting coroutine
            outcome = error
        loop.call_soon_threadsafe(settle, outcome)

    # A thread of its own, which ends with the call: whatever happens in it, no other work of
    # the agent runs in a task's namespace.
    threading.Thread(target=enter, name="levers9-netns", daemon=True).start()
    sock = await made
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


def _socket_in(network: Path) -> socket.socket:
    """A TCP socket of the namespace at `network` (run in the dialer's thread)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(network, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _LIBC.setns(target, CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns into the task's network: {os.strerror(code)}")
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                if _LIBC.setns(home, CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns back: {os.strerror(code)}")
        finally:
            os.close(target)
    finally:
        os.close(home)


def _is_mounted_namespace(path: Path) -> bool:
    """Whether `path` is a namespace's bind mount (not the empty file it was made on)."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except OSError:
        return False


def _slirp_alive(folder: Path) -> int | None:
    """The pid of the folder's slirp4netns while it runs (its start time matching)."""
    try:
        kept = json.loads((folder / "slirp4netns.json").read_text())
        pid, start = int(kept["pid"]), int(kept["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if start_ticks(pid) == start else None


def _remove(folder: Path) -> None:
    pid = _slirp_alive(folder)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for netns in (folder / "netns", folder / "userns"):
        while _is_mounted_namespace(netns):
            if _LIBC.umount2(str(netns).encode(), MNT_DETACH) != 0:
                code = ctypes.get_errno()
                if code != errno.EINVAL:
                    log.error(
                        "task network left mounted", netns=str(netns), error=os.strerror(code)
                    )
                break
    shutil.rmtree(folder, ignore_errors=True)


async def _run(*argv: str, stdin: str | None = None) -> None:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise NetworkError(f"{argv[0]} is not installed on this worker") from None
    _, err = await process.communicate(stdin.encode() if stdin is not None else None)
    if process.returncode != 0:
        words = err.decode(errors="replace").strip().splitlines()
        raise NetworkError(
            f"the task's network: {' '.join(argv[:2])}: {words[-1] if words else 'failed'}"
        )
