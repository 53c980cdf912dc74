"""The CLI's side of `levers9.v1.Tasks/StreamTaskLogs`: a task's output as its worker writes it,
relayed by the controlplane's gateway (the CLI never dials a worker, and never holds a worker's
token; it holds the operator token).
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from levers9.config import ControlplaneSettings
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.rpc import bearer, tls
from levers9.worker.gateway import gateway_channel


class LogStreamUnavailable(Exception):
    """No stream to be had; the message says why and what to do instead."""


async def stream_task_logs(
    settings: ControlplaneSettings, task_id: str, *, follow: bool, offset: int = 0
) -> AsyncIterator[str]:
    """The task's output from `offset`, decoded as it arrives (UTF-8, a character split across
    chunks is kept for the next one); with `follow`, until the task's process exits."""
    token = settings.operator_token()
    if token is None:
        raise LogStreamUnavailable(
            "no operator token: set LEVERS9_API_TOKEN or LEVERS9_API_TOKEN_FILE"
            " (`levers9 dev up` writes one)"
        )
    address = settings.cli_gateway_address()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    metadata = bearer.metadata(token.get_secret_value())
    request = gateway_pb2.StreamTaskLogsRequest(task_id=task_id, follow=follow, offset=offset)
    try:
        credentials = tls.gateway_client_credentials(settings)
    except tls.TlsError as exc:
        raise LogStreamUnavailable(str(exc)) from None
    try:
        async with gateway_channel(address, credentials) as channel:
            stub = gateway_pb2_grpc.TasksStub(channel)
            async for chunk in stub.StreamTaskLogs(request, metadata=metadata):
                text = decoder.decode(chunk.data)
                if text:
                    yield text
    except aio.AioRpcError as exc:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and not details.startswith("worker"):
            raise LogStreamUnavailable(
                f"the gateway at {address} did not answer ({details});"
                " set LEVERS9_GATEWAY_ADDRESS to where it listens"
            ) from None
        raise LogStreamUnavailable(f"{exc.code().name}: {details}") from None
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail
