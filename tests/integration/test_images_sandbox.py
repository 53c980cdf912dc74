"""`levers9 run --image` end to end on the sandbox, as a user runs it: the image named as on GKE
(`us-central1-docker.pkg.dev/...`) is pulled by the worker through the pool's registry mirror
into its node's cache and the task runs in it under runc: its own PID namespace, exactly its
cards as `/dev/nvidiaN` (the sandbox's kubelet made real device nodes for the node's cards),
none of the agent's `LEVERS9_WORKER*` values; the record says `host: runc`. Its container reads
its own limits in its cgroup (v1 or v2): `--cpus` as the CPU quota, the runtime's pids limit. A
missing image ends the task at once, naming the image. Root only (runc), as CI and the worker
Job are.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.agent.cgroups import cgroup_dirs
from levers9.contract import WORK_ROOT
from sandbox import registries, task_images
from tests.controlplane import (
    POOL,
    Controlplane,
    push_worker_image,
    reconciling,
    workers_available,
)
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]

WITHIN = 60
BIN = Path(sys.executable).parent
GAR_HOST = "us-central1-docker.pkg.dev"
IMAGE = f"{GAR_HOST}/demo/tasks/busybox:bb"


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("images")
    with registries.LocalRegistry(directory / "gar") as gar:
        layout = directory / "layout"
        await asyncio.to_thread(task_images.build_busybox, layout, "bb", "from the registry")
        await asyncio.to_thread(
            registries.push_layout, layout, f"{gar.address}/demo/tasks/busybox:bb", "bb"
        )
        await asyncio.to_thread(push_worker_image, directory, gar.address)
        settings: dict[str, Any] = {
            "registryMirrors": f"{GAR_HOST}={gar.address}",
            "insecureRegistries": gar.address,
        }
        async with reconciling(dev_env.client, directory, None, False, **settings) as plane:
            await eventually(lambda: workers_available(plane), within=WITHIN)
            yield plane


async def test_a_task_runs_in_its_image_apart_from_the_agent(cp: Controlplane) -> None:
    script = (
        "cat /etc/levers9-marker; echo; ps -o pid | tail -n +2 | head -1; ls /dev | grep nvidia;"
        " env | grep -c LEVERS9_WORKER; cat /proc/*/environ 2>/dev/null | grep -c WORKER_TOKEN;"
        " true"
    )
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "2", "--image", IMAGE, "--", "sh", "-c", script
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("from the registry")
    _marker, pid, *rest = lines[start:]
    assert pid.strip() == "1", "its own PID namespace: the command is PID 1"
    devices = [line for line in rest if line.startswith("nvidia")]
    assert sorted(d for d in devices if d != "nvidiactl") in (
        ["nvidia0", "nvidia1"],
        ["nvidia2", "nvidia3"],
    ), f"exactly its two cards: {devices}"
    counts = [line for line in rest if line.isdigit()]
    assert counts[:2] == ["0", "0"], "no LEVERS9_WORKER* in its environment or any it can read"
    task_id = lines[0].split()[1]
    record = json.loads((await cp.cli("task", "get", task_id, "-o", "json")).stdout)
    assert record["host"] == "runc"
    assert record["state"] == "succeeded"
    assert record["image_digest"].startswith("sha256:")
    [pull] = [p for p in record["phases"] if p["name"] == "image.pull"]
    assert pull["detail"] in ("cached", *(f"pulled {n} bytes" for n in range(10**6, 2 * 10**6)))
    # A second task of the image on the same node pulls nothing.
    again = await cp.cli("run", "--pool", POOL, "--gpus", "2", "--image", IMAGE, "--", "true")
    second = json.loads((await cp.cli("task", "get", again.stdout.split()[1], "-o", "json")).stdout)
    if second["node_name"] == record["node_name"]:
        assert [p["detail"] for p in second["phases"] if p["name"] == "image.pull"] == ["cached"]
    shown = await cp.cli("task", "get", task_id)
    assert f"image={IMAGE} digest={record['image_digest']} host=runc" in shown.stdout


async def test_memory_and_cpu_limits_from_the_command_line(cp: Controlplane) -> None:
    script = 'x=a; while true; do x="$x$x"; done'
    run = ("run", "--pool", POOL, "--image", IMAGE, "--memory", "48Mi", "--cpus", "500m")
    done = await cp.cli(*run, "--", "sh", "-c", script)
    assert done.returncode == 1
    assert " failed exit_code=137 " in done.stdout
    assert "reason: OOMKilled" in done.stdout
    bad = await cp.cli("run", "--pool", POOL, "--memory", "lots", "--", "true")
    assert bad.returncode == 2
    assert "--memory" in bad.stderr
    assert "is not a Kubernetes quantity" in bad.stderr


CGROUP_LIMITS = (
    # cgroup v2 (`max` or `QUOTA PERIOD`), else v1's two files on one line the same way.
    "echo cgroup-limits; cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo"
    " $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us);"
    " cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
)
"""The container's own CPU quota and pids limit, as it reads them."""


async def _cgroup_limits(cp: Controlplane, *options: str) -> tuple[str, str]:
    done = await cp.cli(
        "run", "--pool", POOL, "--image", IMAGE, *options, "--", "sh", "-c", CGROUP_LIMITS
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "cgroup-limits" in lines, done.stdout
    start = lines.index("cgroup-limits")
    cpu, pids = lines[start + 1 : start + 3]
    return cpu, pids


async def test_cpus_from_the_command_line_is_the_containers_cpu_quota(cp: Controlplane) -> None:
    cpu, _pids = await _cgroup_limits(cp, "--cpus", "1500m")
    assert cpu == "150000 100000", "1.5 CPUs: 150 ms in each 100 ms period"


async def test_the_container_has_the_runtimes_pids_limit(cp: Controlplane) -> None:
    cpu, pids = await _cgroup_limits(cp)
    assert pids == "4096"
    assert cpu in ("max 100000", "-1 100000"), "no --cpus (and no taskDefaults.cpus): no quota"


async def test_without_an_image_the_task_runs_in_the_workers_image(cp: Controlplane) -> None:
    """No taskDefaults.image: the worker's own image, under runc (never a process of the agent)."""
    done = await cp.cli(
        "run", "--pool", POOL, "--", "python3", "-c", "print('in the worker image')"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "in the worker image" in done.stdout.splitlines()
    task_id = done.stdout.split()[1]
    record = json.loads((await cp.cli("task", "get", task_id, "-o", "json")).stdout)
    assert (record["host"], record["image"]) == ("runc", cp.pool.kubernetes.worker_image)


async def test_a_missing_image_fails_at_once_naming_it(cp: Controlplane) -> None:
    missing = f"{GAR_HOST}/demo/tasks/busybox:no-such-tag"
    done = await asyncio.wait_for(
        cp.cli("run", "--pool", POOL, "--image", missing, "--", "true"), timeout=60
    )
    assert done.returncode == 1
    assert " failed (never ran) " in done.stdout, "no exit code that reads like success"
    assert f"cannot pull {missing}: " in done.stdout
    assert "manifest unknown" in done.stdout
    task_id = done.stdout.split()[1]
    record = json.loads((await cp.cli("task", "get", task_id, "-o", "json")).stdout)
    [pull] = [p for p in record["phases"] if p["name"] == "image.pull"]
    assert pull["error"].startswith(f"cannot pull {missing}")
    assert record["exit_code"] is None


@pytest.mark.parametrize("image", [IMAGE, ""], ids=["runc", "process"])
async def test_detach_then_cancel_ends_the_task_cancelled(cp: Controlplane, image: str) -> None:
    started = await cp.cli(
        "run",
        "--pool",
        POOL,
        "--detach",
        *(["--image", image] if image else []),
        "--",
        "sh",
        "-c",
        "trap 'echo terminated; exit 143' TERM; sleep 300 & wait",
    )
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()
    assert len(task_id) == 12, f"--detach prints the task id alone: {started.stdout!r}"

    async def running() -> bool:
        got = await cp.cli("task", "get", task_id, "-o", "json")
        return got.returncode == 0 and json.loads(got.stdout)["state"] == "running"

    await eventually(running, within=WITHIN)
    cancelled = await cp.cli("task", "cancel", task_id, "--reason", "test over")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"task {task_id} cancelled exit_code=143" in cancelled.stdout
    record = json.loads((await cp.cli("task", "get", task_id, "-o", "json")).stdout)
    assert record["state"] == "cancelled"
    assert "container.exit" in [p["name"] for p in record["phases"]]
    again = await cp.cli("task", "cancel", task_id)
    assert again.returncode == 0
    assert f"task {task_id} had already ended: cancelled" in again.stdout
    unknown = await cp.cli("task", "cancel", "nosuchtask00")
    assert unknown.returncode == 1
    assert "no task nosuchtask00" in unknown.stderr


async def test_stop_grace_from_the_command_line(cp: Controlplane) -> None:
    """Its TERM handler takes 3 s to finish; `--stop-grace 1` kills it before (137), where the
    default grace (10 s) would have let it exit 0."""
    started = await cp.cli(
        "run",
        "--pool",
        POOL,
        "--detach",
        "--image",
        IMAGE,
        "--stop-grace",
        "1",
        "--",
        "sh",
        "-c",
        "trap 'sleep 3; exit 0' TERM; sleep 1000 & wait",
    )
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()

    async def running() -> bool:
        got = await cp.cli("task", "get", task_id, "-o", "json")
        return got.returncode == 0 and json.loads(got.stdout)["state"] == "running"

    try:
        await eventually(running, within=WITHIN)
    finally:
        cancelled = await cp.cli("task", "cancel", task_id)  # also when it never ran
    assert f"task {task_id} cancelled exit_code=137" in cancelled.stdout, cancelled.stdout
    bad = await cp.cli("run", "--pool", POOL, "--stop-grace", "-1", "--", "true")
    assert bad.returncode == 2
    assert "--stop-grace" in bad.stderr


async def test_cancel_ends_a_task_that_ignores_sigterm_and_frees_its_port(
    cp: Controlplane,
) -> None:
    """Its shell and a child ignore SIGTERM, another child holds its published port (in the
    task's own network, never on the node): cancel returns once all of it is gone (SIGKILL
    after the grace), its network with it."""
    port = _free_port()
    script = (
        f"trap '' TERM; busybox httpd -f -p {port} & sh -c \"trap '' TERM; sleep 1000\" &"
        " sleep 1000"
    )
    started = await cp.cli(
        "run",
        "--pool",
        POOL,
        "--detach",
        "--image",
        IMAGE,
        "--port",
        str(port),
        "--",
        "sh",
        "-c",
        script,
    )
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()

    seen: dict[str, Any] = {}

    async def ready() -> bool:
        got = await cp.cli("task", "get", task_id, "-o", "json")
        seen.update(json.loads(got.stdout) if got.returncode == 0 else {})
        return seen.get("ready") is True

    try:
        await eventually(ready, within=WITHIN)
    except TimeoutError:
        await cp.cli("task", "cancel", task_id)  # nothing of it outlives the test
        pytest.fail(f"task {task_id} was never ready: {seen}")
    assert not _port_taken(port), "its port is its own network's, not the node's"
    assert _task_networks(cp, task_id), "ready: the agent reached its port in its network"
    cancelled = await cp.cli("task", "cancel", task_id)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"task {task_id} cancelled exit_code=137" in cancelled.stdout
    assert _task_networks(cp, task_id) == [], "its network (and its port) is gone with it"
    assert cgroup_dirs(task_id) == [], "no cgroup of its container, so no process of it, is left"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _task_networks(cp: Controlplane, task_id: str) -> list[Path]:
    """The folders of the task's network on the sandbox's nodes (levers9.agent.task_network)."""
    work = cp.sandbox.state.dir.glob(f"nodes/*/{WORK_ROOT.lstrip('/')}/*/networks/*/task_id")
    return [p.parent for p in work if p.read_text() == task_id]


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
        return False


async def test_no_process_holds_a_worker_token_in_its_environment(cp: Controlplane) -> None:
    """The agents read their tokens from their Secret's files: no process on this machine (the
    agents, their tasks, anything) has a worker's token in its environment."""
    from levers9.records.listing import list_worker_records
    from levers9.tokens import worker_token
    from tests.controlplane import TOKEN_SECRET

    records = await list_worker_records(cp.settings, POOL, include_ended=False)
    tokens = [worker_token(TOKEN_SECRET, r.worker_id).encode() for r in records]
    assert len(tokens) == 3
    scanned, holders = await asyncio.to_thread(_environments_holding, tokens)
    assert scanned > 10, "the scan read the processes' environments"
    assert holders == []


def _environments_holding(secrets: list[bytes]) -> tuple[int, list[str]]:
    """(how many process environments were read, the pids whose environment holds one)."""
    holders = []
    scanned = 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            data = environ.read_bytes()
        except OSError:
            continue
        scanned += 1
        if any(secret in data for secret in secrets):
            holders.append(environ.parent.name)
    return scanned, holders


async def test_exec_runs_in_the_tasks_container(cp: Controlplane) -> None:
    started = await cp.cli(
        "run", "--pool", POOL, "--detach", "--image", IMAGE, "--", "sleep", "300"
    )
    task_id = started.stdout.strip()

    async def running() -> bool:
        got = await cp.cli("task", "get", task_id, "-o", "json")
        return got.returncode == 0 and json.loads(got.stdout)["state"] == "running"

    await eventually(running, within=WITHIN)
    try:
        script = "cat /etc/levers9-marker; echo; ps -o comm | tail -n +2; exit 7"
        inside = await cp.cli("exec", task_id, "--", "sh", "-c", script)
        assert inside.returncode == 7, inside.stderr
        assert inside.stdout.startswith("from the registry")
        assert "sleep" in inside.stdout, "the task's own processes: its PID namespace"
        fed = await asyncio.to_thread(
            subprocess.run,
            [str(BIN / "levers9"), "exec", "-i", task_id, "--", "wc", "-c"],
            input="twelve bytes",
            env=cp.cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (fed.returncode, fed.stdout.strip()) == (0, "12")
        # A known race, kept out of this test's way: a terminal ioctl in the command's first
        # milliseconds can fail under load with `stty: standard input: No child processes`
        # (seen again in a full run on 2026-12-04 once the wait below was removed; a startup
        # race of `runc exec --tty` not understood yet, open in the closing note). This test
        # pins the terminal and its size, not that race, so the command waits a moment first.
        script = "sleep 0.5; tty; stty size; exit 4"
        terminal = await cp.cli("exec", "-t", task_id, "--", "sh", "-c", script)
        assert terminal.returncode == 4, terminal.stderr
        # (text mode reads the terminal's \r\n as \n)
        assert terminal.stdout.splitlines() == ["/dev/pts/0", "24 80"], "a terminal, 24x80"
        shell = await asyncio.to_thread(
            subprocess.run,
            [str(BIN / "levers9"), "exec", "-it", task_id, "--", "sh"],
            input="echo typed-in\nexit 5\n",
            env=cp.cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shell.returncode == 5, shell.stdout + shell.stderr
        assert "typed-in" in shell.stdout.splitlines(), "the shell ran what came on its terminal"
        refused = await cp.cli("exec", task_id, "--bogus", "--", "true")
        assert refused.returncode == 2
        assert "No such option: --bogus" in refused.stderr
    finally:
        await cp.cli("task", "cancel", task_id)
    ended = await cp.cli("exec", task_id, "--", "true")
    assert ended.returncode == 1
    assert f"task {task_id} is cancelled, not running" in ended.stderr


SANDBOX = (
    "echo sandbox; busybox grep ^Seccomp: /proc/self/status | busybox awk '{print $2}';"
    " busybox head -1 /proc/self/uid_map | busybox awk '{print $1, $2}';"
    " cat /sys/fs/cgroup/memory.max 2>/dev/null"
    " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes;"
    " cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
)
"""What a task reads of its sandbox: its seccomp mode, its uid map's first line, its memory and
pids limits (cgroup v2's files, else v1's)."""
V1_UNLIMITED = "9223372036854771712"


async def test_the_task_runs_in_its_sandbox(cp: Controlplane) -> None:
    """As a user on the dev stack sees it (no --memory given): moby's seccomp profile, a user
    namespace of its own range (not the identity map), a memory limit all the same, the pids
    limit (levers9.agent.runc_config; tests/agent/test_runc_sandbox.py has the rest)."""
    done = await cp.cli("run", "--pool", POOL, "--image", IMAGE, "--", "sh", "-c", SANDBOX)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("sandbox")
    seccomp, ids, memory, pids = lines[start + 1 : start + 5]
    assert seccomp == "2", "a seccomp filter"
    inside, node = ids.split()
    assert (inside, int(node) >= 100_000) == ("0", True), f"not the identity map: {ids}"
    assert memory.isdigit(), memory
    assert memory != V1_UNLIMITED, "a memory limit though the task asked for none"
    assert pids == "4096"
