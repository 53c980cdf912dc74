"""The escape suite: what a hostile tenant tries from inside a real task on the sandbox, and
that every attempt is refused while the node, the agents and the other tasks stay healthy.

One controlplane on the sandbox, its pool offering runc and runsc (as the dev stack's) with no
`taskDefaults.image`: every task here names no image, as a tenant's `levers9 run -- CMD` does,
and runs in the worker's own image (built on the Python image). A victim task of another
tenant runs first: an HTTP server on a published port (answering through its agent), a secret
marker in its root and its task folder (read on the node). Then one task runs every probe of
tests/isolation/probe.py at once (shipped as `python3 -c SOURCE CONFIG`), aimed at what the
test found on the node: the gateway, Temporal, the agents' WorkerService ports, the sandbox's
API (its kubelet), the GCP emulator's token server, the image registry, the victim's port, a
listener of the test's own on the node's address and loopback, the metadata server and the
node's resolver (a private range), the victim's and the agents' files and node pids. Each of
those is first shown to answer from the node (or to hold the secret), so a refusal inside the
task is the sandbox's doing; one beyond the node that the node cannot reach here is skipped.
The same probes run again in a task under runsc (gVisor), but those whose answer is gVisor's
kernel speaking of itself (GVISORS_OWN). The destructive probes (fork bomb, memory fill, disk
fill) run in tasks of their own, at once, so that each task's end says why. Last: the victim
still runs and answers through its agent, every agent is registered and available, and a new
task runs.

A probe whose defence has not landed is `xfail(strict=True)` naming what is missing
(PENDING). Root only (runc), as CI and the worker Job are.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.agent.paths import HostPaths
from levers9.agent.runc_config import DEFAULT_LIMITS
from levers9.contract import CREDENTIALS_DIR, TOKEN_FILE
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from levers9.temporal import connect
from sandbox import registries, task_images, worker_image
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.factories import free_port
from tests.isolation import probe
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]

WITHIN = 60
BIN = Path(sys.executable).parent
GAR_HOST = "us-central1-docker.pkg.dev"
WORKER_REPOSITORY = f"demo/{worker_image.REPOSITORY}"
"""Where the dev pool's worker image lives in its project's registry (the Job's image)."""
SOURCE = Path(probe.__file__).read_text()
SECRET_FILE = "victim-secret"
TASK_MOUNT = "/levers9"
"""The task's own folder inside its container (levers9.agent.runc_config)."""
METADATA = "169.254.169.254:80"
SLIRP_HOST = "10.0.2.2"
"""slirp4netns's alias for the node's loopback, inside a task's network."""

NETWORK = (
    "gateway",
    "temporal",
    "agent",
    "kubelet",
    "token-server",
    "registry",
    "other-task-port",
    "other-task-port-node-ip",
    "node-ip",
    "node-loopback",
    "metadata-server",
    "private-range",
    "slirp-host-alias",
)
"""The `connect-*` probes: everything a task may not reach (it may reach the internet only)."""
FILES = ("other-task-files", "agent-token")
ENVIRONS = ("agent-environment", "other-task-environment")
PIDS = ("agent", "other-task")
KERNEL = (
    "read-host-init-environ",
    "seccomp-filter",
    "user-namespace",
    "no-new-privileges",
    "mount",
    "unshare-user",
    "unshare-mount-net",
    "keyctl",
    "raw-socket",
    "write-sys",
    "write-cgroup-limit",
    "write-core-pattern",
    "read-kcore",
    "kernel-log",
    "load-module",
    "bpf",
    "perf-event",
    "open-by-handle",
    "block-device",
    "set-clock",
    "memory-limit",
    "pids-limit",
    "disk-limit",
)
PROBES = (
    *(f"connect-{n}" for n in NETWORK),
    *(f"read-{n}" for n in FILES),
    *(f"environ-{n}" for n in ENVIRONS),
    *(f"ptrace-{n}" for n in PIDS),
    *KERNEL,
)
DESTRUCTIVE = ("fork-bomb", "fill-memory", "fill-disk")
CAPS = {"fork-bomb": 4096, "fill-memory": 1 << 30, "fill-disk": 64 << 30}
"""How big a limit each destructive probe tests by going over it; over that (or none) it reports
the limit and does nothing: a fork bomb under 32768 pids would take this machine down first."""
OWN_LIMITS = {"fill-memory": ("--memory", "256Mi")}
"""The memory probe goes over a limit of its own (the default, 16 GiB, is shown by
`memory-limit`); the others go over the defaults."""

NODE_PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
DEFAULT_PIDS = DEFAULT_LIMITS.pids
PENDING: dict[str, str] = {}
if DEFAULT_PIDS is None or DEFAULT_PIDS >= NODE_PID_MAX:
    PENDING["pids-limit"] = (
        f"the default pids limit ({DEFAULT_PIDS}) is not below this node's pid space"
        f" (kernel.pid_max {NODE_PID_MAX}): one task's fork bomb exhausts the node's pids"
    )
if DEFAULT_PIDS is None or CAPS["fork-bomb"] < DEFAULT_PIDS:
    PENDING["fork-bomb"] = (
        f"the default pids limit ({DEFAULT_PIDS}) is over {CAPS['fork-bomb']}, too many processes"
        " to fork here, and neither a task nor its pool can set a lower one"
    )
"""Probe -> what is missing, for each defence not landed yet (xfail, strict)."""


GVISORS_OWN = {
    "seccomp-filter": "its Seccomp line is the sandbox kernel's",
    "user-namespace": "its uid_map is the sandbox kernel's",
    "no-new-privileges": "its status has no NoNewPrivs line",
    "unshare-user": "a user namespace of the sandbox's kernel, not the node's",
    "kernel-log": "the sandbox kernel's own log (asserted to be gVisor's)",
    "memory-limit": "the limit is on the sandbox's cgroup on the node, not visible inside",
    "pids-limit": "the limit is on the sandbox's cgroup on the node, not visible inside",
}
"""Probes that ask the kernel about itself: under runsc gVisor's kernel answers for itself,
so they say nothing of the node's (the others must be refused there too)."""


def _param(name: str) -> Any:
    if name in PENDING:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=PENDING[name]))
    return name


@dataclass
class Stack:
    cp: Controlplane
    victim: str
    victim_port: int
    config: dict[str, Any]
    """What the probe task is given to aim at."""
    unreachable: dict[str, str]
    """Targets beyond the node that the node itself cannot reach here (nothing to refuse)."""


@dataclass
class Site:
    cp: Controlplane
    registry: str
    """The registry the pool pulls its images from (its mirror), on the node's loopback."""


@pytest.fixture(scope="module")
async def site(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Site]:
    """The controlplane, its pool offering runc and runsc with no `taskDefaults.image`: every
    task here names no image, as a tenant's `levers9 run -- CMD` does, and runs in the worker's
    own image (the dev stack's, built on the Python image), which the pool's registry mirror
    holds where its Job's image is named."""
    directory = tmp_path_factory.mktemp("isolation")
    base, _tag = await asyncio.to_thread(task_images.python_image)
    image = await asyncio.to_thread(worker_image.build, directory / "worker", None, base)
    with registries.LocalRegistry(directory / "gar") as gar:
        await asyncio.to_thread(worker_image.push, image, gar.address, WORKER_REPOSITORY)
        settings: dict[str, Any] = {
            "registryMirrors": f"{GAR_HOST}={gar.address}",
            "insecureRegistries": gar.address,
        }
        runtimes = {"runtimes": ["runc", "runsc"]}
        async with reconciling(
            dev_env.client, directory, None, False, pool_settings=runtimes, **settings
        ) as plane:
            await eventually(lambda: workers_available(plane), within=WITHIN)
            yield Site(plane, gar.address)


def _victim_source(marker: str) -> str:
    """Another tenant's task: a secret in its root and its task folder, an HTTP server on its
    published port on every address."""
    return (
        "import http.server, os, pathlib, signal\n"
        # PID 1 of its namespace: without a handler SIGTERM would wait out the stop's grace.
        "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
        f"for folder in ('/', os.path.dirname(os.environ['LEVERS9_RESULT_PATH'])):\n"
        f"    pathlib.Path(folder, {SECRET_FILE!r}).write_text({marker!r})\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = f'hello from {os.environ[\"LEVERS9_TASK_ID\"]}'.encode()\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n"
    )


def _environs() -> Iterator[tuple[int, dict[str, str]]]:
    """Every process of the node whose environment can be read, with it."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                raw = (entry / "environ").read_bytes()
                pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
                yield int(entry.name), {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _agents(cp: Controlplane) -> list[tuple[int, dict[str, str]]]:
    """The pool's agents on the node (the sandbox kubelet's processes) and the processes they
    started that share their environment, with it."""
    root = str(cp.sandbox.state.dir)
    return [
        (pid, env)
        for pid, env in _environs()
        if env.get("LEVERS9_SANDBOX_ROOT", "").startswith(root) and "LEVERS9_WORKER_ID" in env
    ]


def _task_pids(task_id: str) -> list[int]:
    return [pid for pid, env in _environs() if env.get("LEVERS9_TASK_ID") == task_id]


def _text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _host_files(pid: int, name: str) -> list[str]:
    """Where `name` in the root of the process's container, and in its task folder (`/levers9`),
    is on the node: the root overlay's upper directory, the folder's bind source (the node's
    filesystem holds it, mounted at /)."""
    found = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        root, mount_point = fields[3], fields[4]
        kind, options = fields[fields.index("-") + 1], fields[-1]
        if mount_point == "/" and kind == "overlay":
            found += [
                f"{o.removeprefix('upperdir=')}/{name}"
                for o in options.split(",")
                if o.startswith("upperdir=")
            ]
        if mount_point == TASK_MOUNT:
            found.append(f"{root}/{name}")
    return found


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as sock:
        sock.settimeout(3)
        try:
            sock.connect((host, int(port)))
        except OSError:
            return False
        return True


def _node_sizes(cp: Controlplane) -> dict[str, int]:
    """The node's memory, pid space and disk: what a task's limits must stay under."""
    meminfo = Path("/proc/meminfo").read_text()
    [kib] = [int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal:")]
    disk = os.statvfs(cp.sandbox.state.dir)
    return {
        "memory_bytes": kib * 1024,
        "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()),
        "disk_bytes": disk.f_blocks * disk.f_frsize,
    }


def _node_ip() -> str:
    """The node's own address: the source of its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.254", 9))
        address: str = sock.getsockname()[0]
        return address


def _private_resolver() -> str | None:
    """The node's DNS resolver when it is in a private range (it is here: 10/8)."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(parts[1]).is_private and not parts[1].startswith("127."):
                    return f"{parts[1]}:53"
    return None


def _host_port(url_or_address: str) -> str:
    return re.sub(r"^\w+://", "", url_or_address).split("/")[0]


@pytest.fixture(scope="module")
async def listener() -> AsyncIterator[int]:
    """A port of the test's own on every address of the node: what the node's IP serves."""
    sock = socket.create_server(("0.0.0.0", free_port()), backlog=64)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture(scope="module")
async def stack(site: Site, listener: int) -> Stack:
    cp = site.cp
    marker = f"victim-{uuid.uuid4().hex}"
    port = free_port()
    started = await cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--detach", "--port", str(port),
        "--", "python3", "-c", _victim_source(marker),
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    victim = started.stdout.strip()

    client = await connect(cp.settings)

    async def serving() -> bool:
        record = await task_record(client, victim)
        return record is not None and record.ready and bool(_task_pids(victim))

    try:
        await eventually(serving, within=WITHIN, what="the victim task serves its port")
    except TimeoutError:
        shown = await cp.cli("task", "get", victim)
        raise AssertionError(f"the victim is not serving: {shown.stdout}{shown.stderr}") from None
    answer = await _through_agent(cp, victim, port)
    assert answer == f"hello from {victim}", "the victim's port answers through its agent"
    records = await list_worker_records(cp.settings, POOL, include_ended=False)
    agents = [r.address for r in records if r.address]
    assert len(agents) == 3, records
    worker_hosts = sorted({a.rpartition(":")[0] for a in agents})
    gateway = cp.settings.gateway_listen
    node = _node_ip()
    targets = {
        "gateway": [gateway],
        "temporal": [cp.settings.temporal_address],
        "agent": agents,
        "kubelet": [_host_port(cp.sandbox.sandbox.url)],
        "token-server": [f"127.0.0.1:{cp.sandbox.gcp.port}"],
        "registry": [site.registry],
        "other-task-port": [f"127.0.0.1:{port}", *(f"{h}:{port}" for h in worker_hosts)],
        "other-task-port-node-ip": [f"{node}:{port}"],
        "node-ip": [f"{node}:{listener}"],
        "node-loopback": [f"127.0.0.1:{listener}"],
        "slirp-host-alias": [f"{SLIRP_HOST}:{gateway.rpartition(':')[2]}"],
    }
    for name, addresses in targets.items():
        # The victim's port is shown to answer through its agent above (from the node too,
        # while tasks shared the node's network); slirp's alias exists only inside a task's.
        if not name.startswith("other-task") and name != "slirp-host-alias":
            for address in addresses:
                assert await asyncio.to_thread(_answers, address), f"{name} {address} from the node"
    unreachable: dict[str, str] = {}
    outside: dict[str, str | None] = {
        "metadata-server": METADATA,
        "private-range": _private_resolver(),
    }
    for name, beyond in outside.items():
        # Beyond the node: a refusal proves something only where the node itself gets through.
        if beyond is not None and await asyncio.to_thread(_answers, beyond):
            targets[name] = [beyond]
        else:
            unreachable[name] = f"{beyond or 'no private resolver'} does not answer on this node"
    config = await asyncio.to_thread(_aim, cp, victim, marker)
    config["targets"] = [{"name": n, "addresses": a} for n, a in targets.items()]
    return Stack(cp, victim, port, config, unreachable)


def _aim(cp: Controlplane, victim: str, marker: str) -> dict[str, Any]:
    """The probes task's config but its targets: the victim's and the agents' files and pids,
    each shown to hold what the probe looks for, read here on the node."""
    agents = _agents(cp)
    workers = {env["LEVERS9_WORKER_ID"]: env for _, env in agents}
    assert len(workers) == 3, "one agent per worker of the sandbox's three nodes"
    tokens = [
        str(HostPaths.from_env(env).map(CREDENTIALS_DIR) / TOKEN_FILE) for env in workers.values()
    ]
    assert all(Path(t).read_text() for t in tokens), "the agents' token files, read on the node"
    victim_pids = _task_pids(victim)
    victim_files = sorted(
        {f for pid in victim_pids for f in _host_files(pid, SECRET_FILE) if marker in _text(f)}
    )
    assert victim_files, "the victim's secret, found on the node where its files are"
    victim_files += [f"/proc/{pid}/root/{SECRET_FILE}" for pid in victim_pids]
    host_init = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return {
        "mode": "probes",
        "files": [
            {"name": "other-task-files", "paths": victim_files, "marker": marker},
            {"name": "agent-token", "paths": tokens, "marker": ""},
        ],
        "environs": [
            {"name": "agent-environment", "needle": "LEVERS9_WORKER_ID="},
            {"name": "other-task-environment", "needle": f"LEVERS9_TASK_ID={victim}"},
        ],
        "pids": [
            {"name": "agent", "pids": [pid for pid, _ in agents]},
            {"name": "other-task", "pids": victim_pids},
        ],
        "host_init_cmdline": host_init,
        "node": _node_sizes(cp),
    }


def _lines(output: str) -> dict[str, dict[str, Any]]:
    """The probe's JSON lines in a task's output, by probe (the last line of each wins)."""
    found: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        if line.startswith('{"probe": '):
            parsed: dict[str, Any] = json.loads(line)
            found[parsed["probe"]] = parsed
    return found


async def _probe_task(
    cp: Controlplane, config: dict[str, Any], *options: str
) -> subprocess.CompletedProcess[str]:
    return await cp.cli(
        "run", "--pool", POOL, "--gpus", "0", *options,
        "--", "python3", "-c", SOURCE, json.dumps(config),
    )  # fmt: skip


@pytest.fixture(scope="module")
async def verdicts(stack: Stack) -> dict[str, dict[str, Any]]:
    """Every probe of the probes task, run once for the module."""
    done = await _probe_task(stack.cp, stack.config)
    assert done.returncode == 0, done.stdout + done.stderr
    found = _lines(done.stdout)
    sys.stdout.write("\n".join(json.dumps(v) for v in found.values()) + "\n")
    expected = set(PROBES) - {f"connect-{name}" for name in stack.unreachable}
    assert set(found) == expected, f"probes missing from the output: {done.stdout}"
    return found


@pytest.fixture(scope="module")
async def destroyed(stack: Stack) -> dict[str, subprocess.CompletedProcess[str]]:
    """The destructive probes, each in a task of its own, all at once."""
    node_disk = int(stack.config["node"]["disk_bytes"])
    ran = await asyncio.gather(
        *(
            _probe_task(
                stack.cp,
                {"mode": mode, "cap": CAPS[mode], "node_disk_bytes": node_disk},
                *OWN_LIMITS.get(mode, ()),
            )
            for mode in DESTRUCTIVE
        )
    )
    for done in ran:
        sys.stdout.write(done.stdout)
    return dict(zip(DESTRUCTIVE, ran, strict=True))


@pytest.mark.parametrize("name", [_param(n) for n in PROBES])
def test_the_probe_is_refused(stack: Stack, verdicts: dict[str, dict[str, Any]], name: str) -> None:
    if name.removeprefix("connect-") in stack.unreachable:
        pytest.skip(stack.unreachable[name.removeprefix("connect-")])
    verdict = verdicts[name]
    assert verdict["refused"] is True, f"{verdict['tried']}: {verdict['got']}"


@pytest.mark.parametrize("mode", [_param(m) for m in DESTRUCTIVE])
def test_the_destructive_probe_ends_its_own_task(
    destroyed: dict[str, subprocess.CompletedProcess[str]], mode: str
) -> None:
    done = destroyed[mode]
    verdict = _lines(done.stdout).get(mode)
    reason = {"fork-bomb": "pids limit", "fill-memory": "OOMKilled", "fill-disk": "disk full"}
    assert verdict is not None, done.stdout + done.stderr
    assert verdict["refused"] is True, f"{verdict['tried']}: {verdict['got']}"
    assert done.returncode == 1, done.stdout
    assert f"reason: {reason[mode]}" in done.stdout, done.stdout


@pytest.fixture(scope="module")
async def gvisor_verdicts(stack: Stack) -> dict[str, dict[str, Any]]:
    """Every probe of the probes task again, in a task under runsc (gVisor), once."""
    done = await _probe_task(stack.cp, stack.config, "--runtime", "runsc")
    assert done.returncode == 0, done.stdout + done.stderr
    found = _lines(done.stdout)
    sys.stdout.write("\n".join(json.dumps(v) for v in found.values()) + "\n")
    expected = set(PROBES) - {f"connect-{name}" for name in stack.unreachable}
    assert set(found) == expected, f"probes missing from the output: {done.stdout}"
    return found


@pytest.mark.parametrize("name", [n for n in PROBES if n not in GVISORS_OWN])
def test_under_gvisor_the_probe_is_refused(
    stack: Stack, gvisor_verdicts: dict[str, dict[str, Any]], name: str
) -> None:
    if name.removeprefix("connect-") in stack.unreachable:
        pytest.skip(stack.unreachable[name.removeprefix("connect-")])
    verdict = gvisor_verdicts[name]
    assert verdict["refused"] is True, f"{verdict['tried']}: {verdict['got']}"


def test_under_gvisor_the_kernel_a_task_talks_to_is_gvisors(
    gvisor_verdicts: dict[str, dict[str, Any]],
) -> None:
    got = gvisor_verdicts["kernel-log"]["got"]
    assert "Starting gVisor" in got, got


async def _through_agent(cp: Controlplane, task_id: str, port: int) -> str:
    """GET / from the task's published port through `levers9 port-forward` (its agent)."""
    process = await asyncio.to_thread(
        subprocess.Popen,
        [str(BIN / "levers9"), "port-forward", task_id, f":{port}"],
        env=cp.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        match = re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> \d+\n", line)
        assert match, line
        url = f"http://127.0.0.1:{match.group(1)}/"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=30) as response:
                return str(response.read().decode())

        return await asyncio.to_thread(get)
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 30)


async def test_the_node_the_agents_and_the_other_task_stay_healthy(
    stack: Stack,
    verdicts: dict[str, dict[str, Any]],
    gvisor_verdicts: dict[str, dict[str, Any]],
    destroyed: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # The three fixtures ran every probe before this: the claims below hold after them.
    assert verdicts
    assert gvisor_verdicts
    assert set(destroyed) == set(DESTRUCTIVE)
    cp = stack.cp
    record = json.loads((await cp.cli("task", "get", stack.victim, "-o", "json")).stdout)
    assert record["state"] == "running", record
    answer = await _through_agent(cp, stack.victim, stack.victim_port)
    assert answer == f"hello from {stack.victim}"
    assert await workers_available(cp), "every agent still registered and available"
    done = await cp.cli("run", "--pool", POOL, "--gpus", "0", "--", "python3", "-c", "print(6*7)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "42" in done.stdout.splitlines()
    await cp.cli("task", "cancel", stack.victim)
