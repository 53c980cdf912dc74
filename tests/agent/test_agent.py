"""The agent against a real gateway on 127.0.0.1 (a recording one written for the tests).

Covers registration (retried until the gateway is up; the worker's token as
`authorization: Bearer`; the advertised host:port on the node's external IP, never the node
name; the cards as indices; the product), heartbeats with the running count and idle-since,
ReportTask when a task ends, registering again after the gateway restarts and forgets the
worker, a worker that cannot find its cards refusing to start, and the `levers9-worker`
command itself: the spec's start lines, SIGTERM reporting the running task LOST
(`worker shut down`) and exiting 0, and exit 1 when it cannot start.

Its agents run their tasks as processes (`LEVERS9_PROCESS_TASKS`, the agent's tests' knob that
no Job sets): the point here is the agent's dealings with the gateway, not the container a task
runs in (tests/agent/test_runc_runtime.py), so no registry and no image are needed. Without the
knob, a task that names no image runs in the worker's image, never as a process (the runtime
section below).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpc import aio

from levers9 import logs
from levers9.agent.agent import Agent
from levers9.agent.backoff import Backoff
from levers9.agent.checkpoint import CHECKPOINT_PATH
from levers9.agent.devices import DeviceError
from levers9.agent.gateway import GatewayClient
from levers9.agent.paths import MOUNTS_ENV, ROOT_ENV, HostPaths
from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.contract import DEVICE_PLUGIN_DIR
from levers9.proto import worker_pb2, worker_pb2_grpc
from tests.agent.kit import AUTH, NEIGHBOUR_UID, POD_UID, TOKEN, write_checkpoint
from tests.agent.recording_gateway import Calls, RecordingGateway
from tests.waiting import eventually

NODE = "gke-demo-gpu-2x-8e4b2c6d-q3n8"
EXTERNAL_IP = "127.0.20.2"
PRODUCT = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
WORKER_COMMAND = Path(sys.executable).parent / "levers9-worker"
PY = sys.executable


@pytest.fixture
def worker_env(gateway: RecordingGateway, node_root: Path) -> dict[str, str]:
    """A 2-card worker's environment as the sandbox kubelet builds it."""
    write_checkpoint(node_root, ["nvidia0", "nvidia1"], {POD_UID: ["nvidia0", "nvidia1"]})
    (node_root / "usr/local/nvidia/lib64").mkdir(parents=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LEVERS9_GATEWAY_ADDRESS": gateway.address,
        "LEVERS9_POOL_NAME": "gke-rtx6000",
        "LEVERS9_WORKER_ID": "w1",
        "LEVERS9_WORKER_TOKEN": TOKEN,
        "LEVERS9_NODE_NAME": NODE,
        "LEVERS9_POD_UID": POD_UID,
        "LEVERS9_ADVERTISED_HOST": EXTERNAL_IP,
        "LEVERS9_HOST_IP": "127.0.10.2",
        "LEVERS9_GPU_PRODUCT": PRODUCT,
        "LEVERS9_PROCESS_TASKS": "true",
        ROOT_ENV: str(node_root),
        MOUNTS_ENV: json.dumps({DEVICE_PLUGIN_DIR: str(node_root / DEVICE_PLUGIN_DIR[1:])}),
    }


@dataclass
class RunningAgent:
    agent: Agent
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def address(self) -> str:
        assert self.agent.server is not None
        return self.agent.server.advertised_address


StartAgent = Callable[[Mapping[str, str]], Awaitable[RunningAgent]]


@pytest.fixture
async def start_agent(gateway: RecordingGateway) -> AsyncIterator[StartAgent]:
    """Starts agents in-process until they have registered; stops them after the test."""
    started: list[RunningAgent] = []

    async def start(env: Mapping[str, str]) -> RunningAgent:
        agent = Agent(WorkerSettings.from_env(env), HostPaths.from_env(env), env)
        stop = asyncio.Event()
        running = RunningAgent(agent, stop, asyncio.create_task(agent.run(stop)))
        started.append(running)
        registered = len(gateway.calls.registers) + 1
        await gateway.wait_for(lambda calls: len(calls.registers) >= registered)
        return running

    yield start
    for running in started:
        running.stop.set()
    await asyncio.gather(*(r.task for r in started))


@pytest.fixture
async def worker_stub(
    start_agent: StartAgent, worker_env: dict[str, str]
) -> AsyncIterator[worker_pb2_grpc.WorkerServiceAsyncStub]:
    """WorkerService of a registered in-process agent, dialled at the address it advertised."""
    running = await start_agent(worker_env)
    async with aio.insecure_channel(running.address) as channel:
        yield worker_pb2_grpc.WorkerServiceStub(channel)


def _run_request(task_id: str, code: str) -> worker_pb2.RunTaskRequest:
    return worker_pb2.RunTaskRequest(
        task=worker_pb2.TaskSpec(task_id=task_id, command=[PY, "-c", code], gpu_indices=[1])
    )


def _reported(task_id: str, state: int) -> Callable[[Calls], bool]:
    return lambda calls: any(
        r.status.task_id == task_id and r.status.state == state for r in calls.reports
    )


async def test_registers_with_its_token_and_external_address(
    gateway: RecordingGateway, start_agent: StartAgent, worker_env: dict[str, str]
) -> None:
    running = await start_agent(worker_env)
    [(request, token)] = gateway.calls.registers

    assert token == TOKEN
    assert request.advertised_address == running.address
    host, port = request.advertised_address.rsplit(":", 1)
    assert (host, int(port) > 0) == (EXTERNAL_IP, True)
    assert NODE not in request.advertised_address
    assert (request.pool_name, request.worker_id, request.node_name) == ("gke-rtx6000", "w1", NODE)
    assert request.pod_uid == POD_UID
    assert (request.gpus, list(request.visible_devices)) == (2, [0, 1])
    assert request.gpu_product == PRODUCT
    # What it can checkpoint with, detected (levers9.agent.checkpoints): runsc where it works
    # here, else `none (...)` naming why (criu check's own words among them).
    usable = shutil.which("runsc") is not None
    assert request.checkpoint.startswith("runsc" if usable else "none (runsc: ")


async def test_heartbeats_carry_the_running_count_and_idle_since(
    gateway: RecordingGateway, worker_stub: worker_pb2_grpc.WorkerServiceAsyncStub
) -> None:
    await gateway.wait_for(lambda calls: len(calls.heartbeats) >= 1)
    idle = gateway.calls.heartbeats[-1]
    assert (idle.running_tasks, idle.idle_since_unix_ms > 0) == (0, True)

    await worker_stub.RunTask(_run_request("t-busy", "import time; time.sleep(30)"), metadata=AUTH)
    await gateway.wait_for(lambda calls: calls.heartbeats[-1].running_tasks == 1)
    assert gateway.calls.heartbeats[-1].idle_since_unix_ms == 0


async def test_a_finished_task_is_reported(
    gateway: RecordingGateway, worker_stub: worker_pb2_grpc.WorkerServiceAsyncStub
) -> None:
    await worker_stub.RunTask(_run_request("t-done", "print('done')"), metadata=AUTH)

    await gateway.wait_for(_reported("t-done", worker_pb2.TASK_STATE_SUCCEEDED))
    await gateway.wait_for(lambda calls: len(calls.reports) == 2)
    # Its start is reported too, before its end.
    states = [r.status.state for r in gateway.calls.reports]
    assert states == [worker_pb2.TASK_STATE_RUNNING, worker_pb2.TASK_STATE_SUCCEEDED]
    [report] = [r for r in gateway.calls.reports if r.status.state != worker_pb2.TASK_STATE_RUNNING]
    assert (report.pool_name, report.worker_id) == ("gke-rtx6000", "w1")
    assert report.status.log_tail == "done\n"


async def test_a_tasks_reports_arrive_in_the_order_they_were_made(
    gateway: RecordingGateway,
) -> None:
    """Its start is refused once (retried after a back-off of 0.5 to 1 s): its readiness,
    reported meanwhile, waits its turn, so the gateway's latest is the task's latest; another
    task's report does not wait."""
    gateway.calls.refuse_reports = 1
    running = worker_pb2.TaskStatus(task_id="t1", state=worker_pb2.TASK_STATE_RUNNING)
    ready = worker_pb2.TaskStatus(task_id="t1", state=worker_pb2.TASK_STATE_RUNNING, ready=True)
    async with aio.insecure_channel(gateway.address) as channel:
        client = GatewayClient(channel, TOKEN, "gke-rtx6000", "w1", backoff=Backoff(1.0, 1.0))
        client.report(running)
        await gateway.wait_for(lambda calls: len(calls.refused) == 1)
        client.report(ready)
        client.report(worker_pb2.TaskStatus(task_id="t2", state=worker_pb2.TASK_STATE_RUNNING))
        await client.drain(10)
    assert [r.status for r in gateway.calls.refused] == [running]
    assert [(r.status.task_id, r.status.ready) for r in gateway.calls.reports] == [
        ("t2", False),
        ("t1", False),
        ("t1", True),
    ]


async def test_registers_again_after_the_gateway_restarts(
    gateway: RecordingGateway, start_agent: StartAgent, worker_env: dict[str, str]
) -> None:
    running = await start_agent(worker_env)
    await gateway.restart()

    await gateway.wait_for(lambda calls: len(calls.registers) == 2)
    assert [r.advertised_address for r, _ in gateway.calls.registers] == [running.address] * 2
    await gateway.wait_for(lambda calls: len(calls.heartbeats) >= 1)


async def test_registration_is_retried_until_the_gateway_is_up(
    gateway: RecordingGateway, start_agent: StartAgent, worker_env: dict[str, str]
) -> None:
    await gateway.stop()
    stream = io.StringIO()
    logs.setup("INFO", stream)

    async def refused() -> bool:
        return "gateway registration failed, retrying" in stream.getvalue()

    async def start_once_refused() -> None:
        await eventually(refused, within=30)  # it tried while the gateway was down
        await gateway.start()

    try:
        later = asyncio.create_task(start_once_refused())
        await start_agent(worker_env)
        await later
    finally:
        logs.setup("INFO")
    assert len(gateway.calls.registers) == 1


async def test_a_worker_without_its_cards_does_not_start(
    node_root: Path, worker_env: dict[str, str]
) -> None:
    write_checkpoint(node_root, ["nvidia0", "nvidia1"], {NEIGHBOUR_UID: ["nvidia0"]})
    agent = Agent(WorkerSettings.from_env(worker_env), HostPaths.from_env(worker_env), worker_env)

    with pytest.raises(DeviceError) as raised:
        await agent.run(asyncio.Event())
    assert CHECKPOINT_PATH in str(raised.value)
    assert POD_UID in str(raised.value)


# -- the pool's runtime (LEVERS9_RUNTIME) ------------------------------------------------------

IMAGE = "us-docker.pkg.dev/p/r/torch:2.5"


async def _ended(
    gateway: RecordingGateway, running: RunningAgent, task_id: str, image: str = ""
) -> worker_pb2.TaskStatus:
    """Runs `print('done')` (in `image`, when given) on `running`; its report once it ended."""
    request = _run_request(task_id, "print('done')")
    request.task.image = image
    async with aio.insecure_channel(running.address) as channel:
        await worker_pb2_grpc.WorkerServiceStub(channel).RunTask(request, metadata=AUTH)
    ended = (worker_pb2.TASK_STATE_SUCCEEDED, worker_pb2.TASK_STATE_FAILED)
    await gateway.wait_for(
        lambda calls: any(
            r.status.task_id == task_id and r.status.state in ended for r in calls.reports
        )
    )
    [report] = [
        r for r in gateway.calls.reports if r.status.task_id == task_id and r.status.state in ended
    ]
    return report.status


@pytest.mark.parametrize("runtime", ["process", "runc", None])
async def test_a_task_without_an_image_runs_as_a_process_under_the_tests_knob(
    gateway: RecordingGateway,
    start_agent: StartAgent,
    worker_env: dict[str, str],
    runtime: str | None,
) -> None:
    """`process` runs every task so; `runc` (also when the Job names none) runs so a task that
    names no image and has no pool default, but only under LEVERS9_PROCESS_TASKS."""
    env = worker_env if runtime is None else {**worker_env, "LEVERS9_RUNTIME": runtime}
    status = await _ended(gateway, await start_agent(env), "t-plain")

    assert (status.state, status.host, status.log_tail) == (
        worker_pb2.TASK_STATE_SUCCEEDED,
        "process",
        "done\n",
    )


def _without_knob(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "LEVERS9_PROCESS_TASKS"}


async def test_a_task_without_an_image_runs_in_the_workers_image(
    gateway: RecordingGateway, start_agent: StartAgent, worker_env: dict[str, str]
) -> None:
    """No task outside a container: without the knob, a task that names no image (and no pool
    default) is a task in the Job's own image, which this worker (no imagesPath) cannot run."""
    running = await start_agent({**_without_knob(worker_env), "LEVERS9_WORKER_IMAGE": IMAGE})
    status = await _ended(gateway, running, "t-plain")

    assert (status.state, status.host, status.reason) == (
        worker_pb2.TASK_STATE_FAILED,
        "runc",
        "this worker cannot run images: the Job sets no LEVERS9_IMAGES_PATH (the pool's"
        " imagesPath)",
    )
    assert status.image == IMAGE


async def test_a_task_without_any_image_to_run_in_is_refused(
    gateway: RecordingGateway, start_agent: StartAgent, worker_env: dict[str, str]
) -> None:
    """A Job that names neither a default image nor its own (an older controlplane's)."""
    status = await _ended(gateway, await start_agent(_without_knob(worker_env)), "t-plain")

    assert (status.state, status.host, status.reason) == (
        worker_pb2.TASK_STATE_FAILED,
        "runc",
        "the task names no image and this worker has none to give it: set the pool's"
        " taskDefaults.image, or run the worker from an image (its Job's LEVERS9_WORKER_IMAGE)",
    )


async def test_the_process_runtime_needs_the_tests_knob(worker_env: dict[str, str]) -> None:
    env = {**_without_knob(worker_env), "LEVERS9_RUNTIME": "process"}
    agent = Agent(WorkerSettings.from_env(env), HostPaths.from_env(env), env)

    with pytest.raises(SettingsError) as raised:
        await agent.run(asyncio.Event())
    assert str(raised.value) == (
        "LEVERS9_RUNTIME=process runs tasks outside any container: only the agent's own tests"
        " take it, with LEVERS9_PROCESS_TASKS set (the pool's runtime, config.worker.pools"
        ".gke-rtx6000.runtime, is runc or runsc)"
    )
    assert agent.server is None


@pytest.mark.parametrize(
    ("runtime", "why"),
    [
        (
            "process",
            "the pool's runtime is process (config.worker.pools.gke-rtx6000.runtime): its tasks"
            " run as processes of the worker, without images; set runtime: runc to run images",
        ),
        ("runc", "the Job sets no LEVERS9_IMAGES_PATH (the pool's imagesPath)"),
    ],
)
async def test_a_task_with_an_image_fails_where_the_runtime_cannot_run_one(
    gateway: RecordingGateway,
    start_agent: StartAgent,
    worker_env: dict[str, str],
    runtime: str,
    why: str,
) -> None:
    running = await start_agent({**worker_env, "LEVERS9_RUNTIME": runtime})
    status = await _ended(gateway, running, "t-image", image=IMAGE)

    assert (status.state, status.reason) == (
        worker_pb2.TASK_STATE_FAILED,
        f"this worker cannot run images: {why}",
    )


@pytest.mark.parametrize("setting", ["runtime", "runtimes"])
async def test_a_runtime_the_agent_has_not_built_stops_it_before_anything(
    gateway: RecordingGateway, worker_env: dict[str, str], setting: str
) -> None:
    env = {**worker_env, f"LEVERS9_{setting.upper()}": "kata"}
    agent = Agent(WorkerSettings.from_env(env), HostPaths.from_env(env), env)

    with pytest.raises(SettingsError) as raised:
        await agent.run(asyncio.Event())  # returns: it had its chance to register
    assert str(raised.value) == (
        f"LEVERS9_{setting.upper()} (the pool's {setting}, config.worker.pools.gke-rtx6000"
        f".{setting}): unknown runtime 'kata': use one of process, runc, runsc"
    )
    assert (agent.server, gateway.calls.registers) == (None, [])


# -- the command -------------------------------------------------------------------------------


async def _command(env: Mapping[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("wb") as sink:
        return await asyncio.create_subprocess_exec(
            str(WORKER_COMMAND), env=dict(env), stdout=sink, stderr=sink
        )


async def test_sigterm_reports_running_tasks_lost_and_exits_0(
    gateway: RecordingGateway, worker_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    process = await _command(worker_env, log)
    try:
        await gateway.wait_for(lambda calls: len(calls.registers) == 1)
        address = gateway.calls.registers[0][0].advertised_address
        async with aio.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            code = "import time; print('up', flush=True); time.sleep(60)"
            await stub.RunTask(_run_request("t-long", code), metadata=AUTH)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    states = sorted(r.status.state for r in gateway.calls.reports)  # its start, its end
    assert states == [worker_pb2.TASK_STATE_RUNNING, worker_pb2.TASK_STATE_LOST]
    [report] = [r for r in gateway.calls.reports if r.status.state != worker_pb2.TASK_STATE_RUNNING]
    assert report.status.reason == "worker shut down"
    lines = [line.split(maxsplit=2)[2] for line in log.read_text().splitlines() if line.strip()]
    assert lines[:2] == [
        'host driver libraries registered with the loader dirs=["/usr/local/nvidia/lib64"]',
        "resolved NVIDIA_VISIBLE_DEVICES for GPU filtering resolved_visible_devices=0,1",
    ]


async def test_the_command_exits_1_when_it_cannot_start(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    env = {**worker_env, "LEVERS9_POD_UID": NEIGHBOUR_UID}
    process = await _command(env, log)

    assert await asyncio.wait_for(process.wait(), 20) == 1
    [failure] = [line for line in log.read_text().splitlines() if "ERROR" in line]
    assert "worker cannot start" in failure
    assert CHECKPOINT_PATH in failure
    assert NEIGHBOUR_UID in failure
