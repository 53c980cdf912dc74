"""A box's published ports on the endpoints' front: `<endpoints URL>/box/<workspace>/<box>/<port>/
<path>` proxied to that port of the box's running task (`levers9 box ports` prints the URLs).

A request is authorized as an endpoint's is: `Authorization: Bearer <token>`, the operator's or
one of the box's own workspace (another workspace's finds no such box, 404, as a missing one);
the header never reaches the box. Only a port the box published (`box create --port`) is
reached. The request goes as HTTP/1.1 onto a `WorkerService/PortForward` stream to the port (the
path endpoint replicas and `levers9 port-forward` take), one stream per request, and its
response is streamed back. Each request tells the box's record of a use (at most once per
`USE_EVERY_S` per box and front), which moves its `--idle-stop` deadline. A box that is stopped,
or whose task does not run yet, is 503 saying so; a WebSocket handshake is 501.
"""

from __future__ import annotations

import hmac
import time

from aiohttp import web
from pydantic import SecretStr

from levers9.core.boxes import RUNNING, box_name_problem
from levers9.core.workspaces import name_problem
from levers9.gateway.box_service import task_state
from levers9.gateway.endpoint_messages import (
    Refused,
    refuse_websocket,
    request_body,
    request_head,
    streamed,
    whole,
)
from levers9.gateway.errors import Unauthenticated
from levers9.gateway.replica_streams import Exchange, Replica, ReplicaFailed
from levers9.gateway.roles import Authority
from levers9.gateway.task_service import TasksService
from levers9.logs import get_logger
from levers9.records.boxes import TemporalBoxRecords
from levers9.tokens import operator_token

log = get_logger(__name__)
USE_EVERY_S = 30.0
MAX_BODY_BYTES = 64 * 2**20
PREFIX = "box"
"""The front's path for boxes: an endpoint may not be named so."""


def box_url(endpoints_url: str, workspace: str, name: str, port: int) -> str:
    return f"{endpoints_url.rstrip('/')}/{PREFIX}/{workspace}/{name}/{port}/"


class BoxFront:
    def __init__(
        self,
        boxes: TemporalBoxRecords,
        tasks: TasksService,
        secret: SecretStr,
        operator_generation: int = 1,
    ) -> None:
        self._boxes = boxes
        self._tasks = tasks
        self._authority: Authority = tasks.authority
        self._operator_token = SecretStr(
            operator_token(secret.get_secret_value(), operator_generation)
        )
        self._told: dict[tuple[str, str], float] = {}

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except Refused as refused:
            return web.Response(
                status=refused.status,
                text=f"{refused}\n",
                headers={"WWW-Authenticate": "Bearer"} if refused.status == 401 else None,
            )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = request.raw_path.partition("?")[0].split("/")
        # "", "box", workspace, name, port, ...
        if len(parts) < 5 or not parts[4].isdigit():
            raise Refused(404, "a box's port is <endpoints URL>/box/<workspace>/<box>/<port>/")
        workspace, name, port = parts[2], parts[3], int(parts[4])
        if name_problem(workspace) is not None or box_name_problem(name) is not None:
            raise Refused(404, f"no box {name}: `levers9 box list` shows them")
        await self._authorize(request, workspace, name)
        box = await self._boxes.get(workspace, name)
        if box is None:
            raise Refused(404, f"no box {name}: `levers9 box list` shows them")
        if port not in box.task.ports:
            published = ", ".join(map(str, box.task.ports)) or "none"
            raise Refused(404, f"box {name} publishes no port {port} (published: {published})")
        if box.state != RUNNING:
            raise Refused(503, f"box {name} is {box.state}: levers9 box start {name}")
        record = await self._tasks.record_of(box.task_id)
        if task_state(record) != "running" or record is None or record.worker_id is None:
            state = task_state(record) or "not started"
            raise Refused(503, f"box {name}'s task {box.task_id} is {state}, not running yet")
        refuse_websocket(name, request)
        now = time.monotonic()
        if now - self._told.get((workspace, name), -USE_EVERY_S) >= USE_EVERY_S:
            self._told[(workspace, name)] = now
            await self._boxes.used(box)
        prefix = f"{PREFIX}/{workspace}/{name}/{port}"
        body = await request_body(request, MAX_BODY_BYTES)
        replica = Replica(self._tasks, record, port)
        exchange: Exchange | None = None
        try:
            stream = await replica.stream()
            exchange = Exchange(replica, stream, head_request=request.method == "HEAD")
            await exchange.send(request_head(prefix, request, port), body)
            if exchange.done and request.method != "HEAD":
                return whole(exchange, box.task_id)
            response = streamed(exchange, box.task_id)
            await response.prepare(request)
            if exchange.first:
                await response.write(exchange.first)
            async for data in exchange.rest():
                await response.write(data)
            await response.write_eof()
            return response
        except ReplicaFailed as exc:
            log.info("box port failed", box=name, workspace=workspace, port=port, error=str(exc))
            raise Refused(502, f"box {name}'s port {port} did not answer: {exc}") from None
        finally:
            if exchange is not None:
                await exchange.release()
            await replica.close()

    async def _authorize(self, request: web.BaseRequest, workspace: str, name: str) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(
                401,
                "a box's port needs `Authorization: Bearer <token>`: one of its workspace's or"
                " the operator's",
            )
        if hmac.compare_digest(self._operator_token.get_secret_value(), token.strip()):
            return
        try:
            identity = await self._authority.identify([("authorization", header)])
        except Unauthenticated as refused:
            raise Refused(401, f"the bearer token is refused: {refused.message}") from None
        if not identity.sees(workspace):
            raise Refused(404, f"no box {name}: `levers9 box list` shows them")
