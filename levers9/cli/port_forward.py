"""`levers9 port-forward TASK [LOCAL:]REMOTE ...`: a published port of a task's container on
this machine, as `kubectl port-forward` does for a pod.

Each connection accepted on the local port is one `Tasks/PortForward` stream to the gateway
(with the operator token), which the gateway relays to the task's worker: over TLS directly, or
through the worker's tunnel. Only ports the task published (`levers9 run --port`) are reached.
It prints `Forwarding from 127.0.0.1:<local> -> <remote>` per port and `Handling connection for
<local>` per connection, and runs until interrupted or the task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Annotated

import grpc
import typer

from levers9.cli import gateway_api
from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable
from levers9.cli.output import console, fail
from levers9.cli.runtime import settings_from_env
from levers9.config import ControlplaneSettings
from levers9.logs import get_logger

log = get_logger(__name__)
CHECK_EVERY_S = 5.0
"""How often the session reads the task's record (it ends when the task does)."""


def parse_mapping(text: str) -> tuple[int, int]:
    """`8080` (the same port here), `9000:8080`, `:8080` (any free port here)."""
    local, colon, remote = text.rpartition(":")
    if not colon:
        local, remote = text, text
    try:
        remote_port = int(remote)
        local_port = int(local) if local else 0
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give [LOCAL:]REMOTE ports, e.g. 8080 or 9000:8080", param_hint="PORTS"
        ) from None
    if not 0 < remote_port < 65536 or not 0 <= local_port < 65536:
        raise typer.BadParameter(f"{text!r}: ports are 1-65535", param_hint="PORTS")
    return local_port, remote_port


def port_forward(
    task_id: Annotated[str, typer.Argument(help="the running task")],
    ports: Annotated[list[str], typer.Argument(help="[LOCAL:]REMOTE, e.g. 8080 or 9000:8080")],
    address: Annotated[
        str, typer.Option("--address", help="the local address to listen on")
    ] = "127.0.0.1",
) -> None:
    """Forward local ports to a task's published container ports, as kubectl port-forward."""
    mappings = [parse_mapping(text) for text in ports]
    settings = settings_from_env()
    try:
        code = asyncio.run(_serve(settings, task_id, mappings, address))
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    raise typer.Exit(code)


async def _serve(
    settings: ControlplaneSettings, task_id: str, mappings: list[tuple[int, int]], address: str
) -> int:
    record = await gateway_api.task_record(settings, task_id)
    if record is None:
        raise GatewayRefused(grpc.StatusCode.NOT_FOUND, f"no task {task_id}")
    if record.state != "running":
        fail([f"task {task_id} is {record.state}, not running: its ports are closed"])
        return 1
    unpublished = [remote for _, remote in mappings if remote not in record.ports]
    if unpublished:
        published = ", ".join(map(str, record.ports)) or "none"
        fail(
            [
                f"task {task_id} did not publish port {unpublished[0]} (published: {published});"
                f" run it with --port {unpublished[0]}"
            ]
        )
        return 1
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for local, remote in mappings:
            forward = await stack.enter_async_context(
                gateway_api.port_forwarder(settings, task_id, remote)
            )
            try:
                server = await asyncio.start_server(_handler(forward, local), address, local)
            except OSError as exc:
                fail([f"cannot listen on {address}:{local}: {exc.strerror or exc}"])
                return 1
            servers.append(server)
            bound = server.sockets[0].getsockname()[1]
            console.print(f"Forwarding from {address}:{bound} -> {remote}", highlight=False)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ended = asyncio.create_task(_until_ended(settings, task_id))
        waiting = asyncio.create_task(stop.wait())
        await asyncio.wait({ended, waiting}, return_when=asyncio.FIRST_COMPLETED)
        for task in (ended, waiting):
            task.cancel()
        for server in servers:
            server.close()
        if ended.done() and not ended.cancelled() and ended.exception() is None:
            fail([f"task {task_id} ended ({ended.result()}): its ports are closed"])
            return 1
    return 0


def _handler(
    forward: gateway_api.PortForwarder, local: int
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        console.print(f"Handling connection for {local}", highlight=False)
        try:
            await forward(reader, writer)
        except (GatewayRefused, GatewayUnavailable) as exc:
            fail([f"connection for {local}: {exc}"])
            writer.transport.abort()
            return
        except (OSError, asyncio.CancelledError):
            writer.transport.abort()
            return
        writer.close()

    return handle


async def _until_ended(settings: ControlplaneSettings, task_id: str) -> str:
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        with contextlib.suppress(GatewayUnavailable):
            record = await gateway_api.task_record(settings, task_id)
            if record is None or record.state != "running":
                return record.state if record is not None else "gone"
