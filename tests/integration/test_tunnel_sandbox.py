"""Tunnel mode end to end on the sandbox (`tunnel: true`, `hostNetwork: false`): the workers dial
the gateway and nothing dials them; the tunnel is the only path to their WorkerService.

- Workers become available with their record pointing at the gateway's end of their session,
  and their pods on the pod network.
- The GPU check, `levers9 run` (output streamed), `levers9 task logs` and Exec all go through it.
- A worker refuses a target that is not itself; a forged token, or another worker's token, opens
  no tunnel.
- Many concurrent streams share one tunnel.
- A gateway restart mid-task: the agent reconnects and registers again, and the task completes
  (never lost).

The tests of this module share one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from levers9.gateway.server import Gateway
from levers9.models import WorkerRecord
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from levers9.temporal import connect
from levers9.tokens import command_metadata, worker_token
from levers9.tunnel.mux import StreamRefused
from tests.controlplane import POOL, TOKEN_SECRET, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
WITHIN = 60


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("tunnel"), tunnel=True, containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane, 3), within=WITHIN)
        yield plane


async def _workers(cp: Controlplane) -> list[WorkerRecord]:
    return await list_worker_records(cp.settings, POOL, include_ended=False)


async def test_workers_are_reached_only_through_their_tunnels(cp: Controlplane) -> None:
    assert cp.gateway is not None
    hub = cp.gateway.tunnels
    assert hub is not None
    assert hub.sessions == 3
    for record in await _workers(cp):
        endpoint = hub.endpoint(POOL, record.worker_id)
        assert endpoint is not None
        # The record points at the gateway's end of the session, on this replica's queue.
        assert record.address == endpoint[0]
        assert record.task_queue == endpoint[1] == cp.settings.replica_task_queue
        assert not record.tls, "the tunnel's end is dialed in-process; the tunnel carries TLS"
    pods = json.loads(await cp.kubectl("get", "pods", "-n", "levers9", "-o", "json"))["items"]
    assert len(pods) == 3
    secrets = json.loads(await cp.kubectl("get", "secrets", "-n", "levers9", "-o", "json"))
    assert [sorted(s["data"]) for s in secrets["items"]] == [
        ["command-token.sha256", "token"]
    ] * 3, "no certificate"
    for pod in pods:
        assert pod["spec"].get("hostNetwork", False) is False
        assert pod["status"]["podIP"] != pod["status"]["hostIP"]
        # WorkerService listens on a unix socket only: the tunnel is the one way in.
        log = await cp.kubectl("logs", "-n", "levers9", pod["metadata"]["name"])
        assert "serving WorkerService address=unix:" in log
        assert " tls=false\n" in log
        assert "tunnel ready session_id=" in log


async def test_the_gpu_check_and_run_work_through_the_tunnel(cp: Controlplane) -> None:
    check = await cp.cli("pool", "check", "--pool", POOL, "--gpu", "RTXPro6000")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "COMPLETE {" in check.stdout
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "2", "--", "sh", "-c", "echo through; echo tunnel"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "through\ntunnel\n" in done.stdout
    assert "no log stream" not in done.stderr
    task_id = done.stdout.split()[1]
    logs = await cp.cli("task", "logs", task_id)
    assert logs.stdout == "through\ntunnel\n", logs.stderr


async def test_exec_and_many_concurrent_streams_share_one_tunnel(cp: Controlplane) -> None:
    client = await connect(cp.settings)
    started = await cp.cli("run", "--pool", POOL, "--wait", "0", "--", "sleep", "300")
    task_id = started.stdout.split()[1]

    async def placed() -> bool:
        found = await task_record(client, task_id)
        return found is not None and found.state == "running"

    await eventually(placed, within=WITHIN)
    found = await task_record(client, task_id)
    assert found is not None
    assert found.address is not None
    metadata = command_metadata(TOKEN_SECRET, str(found.worker_id))  # as the controlplane
    async with aio.insecure_channel(found.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        async def requests() -> AsyncIterator[worker_pb2.ExecRequest]:
            start = worker_pb2.ExecStart(task_id=task_id, command=["sh", "-c", "echo exec-ok"])
            yield worker_pb2.ExecRequest(start=start)

        out, code = b"", None
        async for response in stub.Exec(requests(), metadata=metadata):
            kind = response.WhichOneof("message")
            if kind == "stdout":
                out += response.stdout
            elif kind == "exit_code":
                code = response.exit_code
        assert (out, code) == (b"exec-ok\n", 0)

        # 100 calls at once, each its own stream inside the one tunnel.
        calls = [
            stub.GetTask(worker_pb2.GetTaskRequest(task_id=task_id), metadata=metadata)
            for _ in range(100)
        ]
        statuses = await asyncio.gather(*calls)
        assert {s.state for s in statuses} == {worker_pb2.TASK_STATE_RUNNING}
    await stub_cancel(found.address, metadata, task_id)


async def stub_cancel(address: str, metadata: tuple[tuple[str, str], ...], task_id: str) -> None:
    async with aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        await stub.CancelTask(worker_pb2.CancelTaskRequest(task_id=task_id), metadata=metadata)


async def test_a_worker_refuses_targets_that_are_not_itself(cp: Controlplane) -> None:
    assert cp.gateway is not None
    hub = cp.gateway.tunnels
    assert hub is not None
    records = await _workers(cp)
    pods = json.loads(await cp.kubectl("get", "pods", "-n", "levers9", "-o", "json"))["items"]
    other_pod_ip = pods[1]["status"]["podIP"]
    for target in ("203.0.113.9:22", f"{other_pod_ip}:8000", "worker.example:443", "db"):
        with pytest.raises(StreamRefused, match="is not this worker"):
            await hub.open(POOL, records[0].worker_id, target)
    stream = await hub.open(POOL, records[0].worker_id, "worker")
    await stream.reset("done")


async def test_a_refused_target_is_in_the_worker_pod_log(cp: Controlplane) -> None:
    """The troubleshooting row `tunnel target refused target=...`, in the pod log of the
    worker asked, and no other's."""
    assert cp.gateway is not None
    hub = cp.gateway.tunnels
    assert hub is not None
    record = (await _workers(cp))[0]
    target = "198.51.100.7:5432"
    with pytest.raises(StreamRefused, match="is not this worker"):
        await hub.open(POOL, record.worker_id, target)
    pods = json.loads(await cp.kubectl("get", "pods", "-n", "levers9", "-o", "json"))["items"]
    line = re.compile(rf"^\S+ WARNING tunnel target refused target={re.escape(target)}$", re.M)

    async def logs() -> dict[str, int]:
        return {
            pod["spec"]["nodeName"]: len(
                line.findall(await cp.kubectl("logs", "-n", "levers9", pod["metadata"]["name"]))
            )
            for pod in pods
        }

    async def logged() -> bool:
        return sum((await logs()).values()) > 0

    await eventually(logged, within=WITHIN)
    assert {node: n for node, n in (await logs()).items() if n} == {record.node_name: 1}


async def test_endpoint_traffic_reaches_a_port_of_the_workers_own_containers(
    cp: Controlplane,
) -> None:
    """TCP to `127.0.0.1:<port>` on the worker (here an echo server standing in for a model
    server's port: in the sandbox the worker's containers share this machine's loopback)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    assert cp.gateway is not None
    assert cp.gateway.tunnels is not None
    worker_id = (await _workers(cp))[0].worker_id
    try:
        stream = await cp.gateway.tunnels.open(POOL, worker_id, f"127.0.0.1:{port}")
        payload = bytes(range(256)) * 4096  # 1 MiB, several windows' worth
        await stream.write(payload)
        await stream.write_eof()
        received = b""
        while chunk := await stream.read():
            received += chunk
        assert received == payload
    finally:
        server.close()
        await server.wait_closed()


async def _open_tunnel(cp: Controlplane, token: str, worker_id: str) -> grpc.StatusCode | None:
    """Opens a tunnel as `worker_id` with `token`; the status it ends with (None: ready)."""
    answered = asyncio.Event()
    async with aio.insecure_channel(cp.settings.gateway_advertised_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def frames() -> AsyncIterator[gateway_pb2.TunnelFrame]:
            hello = gateway_pb2.TunnelHello(pool_name=POOL, worker_id=worker_id)
            yield gateway_pb2.TunnelFrame(hello=hello)
            # The hello's side stays open until the gateway has answered it: a closed side
            # would end the session before the gateway could say ready or refuse.
            await answered.wait()

        call = stub.Tunnel(frames(), metadata=(("authorization", f"Bearer {token}"),))
        try:
            async with asyncio.timeout(WITHIN):
                first = await call.read()
        except aio.AioRpcError as error:
            return error.code()
        except TimeoutError:
            raise AssertionError(
                f"the gateway neither answered nor refused the tunnel hello within {WITHIN} s"
            ) from None
        finally:
            answered.set()
            call.cancel()
        assert isinstance(first, gateway_pb2.TunnelFrame)
        return None if first.WhichOneof("kind") == "ready" else grpc.StatusCode.UNKNOWN


async def test_only_the_workers_own_token_opens_its_tunnel(cp: Controlplane) -> None:
    records = await _workers(cp)
    mine, other = records[0].worker_id, records[1].worker_id
    forged = await _open_tunnel(cp, "l9w1.forged", mine)
    assert forged == grpc.StatusCode.UNAUTHENTICATED
    borrowed = await _open_tunnel(cp, worker_token(TOKEN_SECRET, other), mine)
    assert borrowed == grpc.StatusCode.UNAUTHENTICATED
    assert cp.gateway is not None
    assert cp.gateway.tunnels is not None
    assert cp.gateway.tunnels.sessions == 3  # nothing was replaced


async def test_a_gateway_restart_mid_task_loses_nothing(cp: Controlplane) -> None:
    before = {r.worker_id: r.address for r in await _workers(cp)}
    started = await cp.cli(
        "run", "--pool", POOL, "--wait", "0", "--", "sh", "-c", "sleep 4; echo survived"
    )
    task_id = started.stdout.split()[1]
    client = await connect(cp.settings)

    async def running() -> bool:
        found = await task_record(client, task_id)
        return found is not None and found.state == "running"

    await eventually(running, within=WITHIN)
    gateway = cp.gateway
    assert gateway is not None
    hub = gateway.tunnels
    assert hub is not None
    await gateway.stop(grace=0)
    assert hub.sessions == 0
    restarted = Gateway(
        gateway.records,
        SecretStr(TOKEN_SECRET),
        tasks=gateway.task_records,
        tunnels=hub,
    )
    await restarted.start(cp.settings.gateway_listen)
    cp.gateway = restarted

    async def succeeded() -> bool:
        found = await task_record(client, task_id)
        return found is not None and found.state == "succeeded"

    await eventually(succeeded, within=WITHIN)
    found = await task_record(client, task_id)
    assert found is not None
    assert "survived" in found.log_tail

    async def rehomed() -> bool:
        now = {r.worker_id: r.address for r in await _workers(cp)}
        return (
            hub.sessions == 3
            and set(now) == set(before)
            and all(now[w] != before[w] for w in before)
        )

    await eventually(rehomed, within=WITHIN)
    again = await cp.cli("run", "--pool", POOL, "--", "echo", "after")
    assert again.returncode == 0, again.stdout + again.stderr
