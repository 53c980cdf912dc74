"""`levers9.v1.Endpoints`: endpoints (EndpointWorkflow's records), for `levers9 endpoint ...`.

The operator sees and does all, and creates an endpoint in any workspace that exists (none
named: `default`). A workspace token creates endpoints in its own workspace only (one naming
another is PERMISSION_DENIED), and gets, lists and deletes only its own: another workspace's
endpoint answers NOT_FOUND in exactly the words of one that does not exist, and nothing is told
to it. Whose an endpoint is comes from its record's memo (the spec it was created with), which
Temporal holds without a Temporal worker: so even with none running, another workspace's
endpoint is NOT_FOUND, never UNAVAILABLE.

Endpoint names are the controlplane's (each is `<endpoints URL>/<name>/`): creating a name
another workspace holds is ALREADY_EXISTS.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from pydantic import ValidationError

from levers9.contract import DNS_LABEL, ready_path_problem, task_input_problem
from levers9.core.endpoints import EndpointSpec
from levers9.core.image_reference import ImageReference, ImageReferenceError
from levers9.endpoint_wire import spec_from_message, spec_message, view_message
from levers9.gateway.convert import MAX_COMMAND_ARGS, MAX_CPU_MILLIS, MAX_GPUS, MAX_MEMORY_BYTES
from levers9.gateway.errors import InvalidRequest, shown
from levers9.gateway.roles import Authority, Identity
from levers9.gateway.scope import call_workspace, identify
from levers9.logs import get_logger
from levers9.proto import endpoints_pb2, endpoints_pb2_grpc
from levers9.records.endpoints import EndpointExists, TemporalEndpointRecords
from levers9.records.found import NoQueryAnswer

Context = grpc.aio.ServicerContext[Any, Any]
MAX_DELETE_WAIT_S = 300.0
"""The longest a DeleteEndpoint waits for the replicas to end (a client asks for less)."""

MAX_ENDPOINT_SECONDS = 366 * 24 * 3600.0
"""An endpoint's idle, cold-start and request timeouts: at most a year (its workflow's timers
take any finite number of seconds up to there)."""
MAX_ENDPOINT_REPLICAS = 1024

log = get_logger(__name__)


def submitted_endpoint(request: endpoints_pb2.CreateEndpointRequest) -> EndpointSpec:
    """An endpoint as a client asks for it (its workspace as sent: "" for the caller's own)."""
    if not request.HasField("spec"):
        raise InvalidRequest("spec", "missing: the endpoint to create (its name, pool, command)")
    sent = request.spec
    _label("spec.name", sent.name, "an endpoint name")
    if sent.name == "ui":
        raise InvalidRequest("spec.name", "ui is the dashboard's path (<endpoints URL>/ui/)")
    if sent.name == "box":
        raise InvalidRequest("spec.name", "box is the boxes' ports' path (<endpoints URL>/box/)")
    _label("spec.pool_name", sent.pool_name, "a pool name")
    if not sent.command:
        raise InvalidRequest("spec.command", "missing: give the replicas' command after --")
    if len(sent.command) > MAX_COMMAND_ARGS:
        raise InvalidRequest(
            "spec.command", f"{len(sent.command)} arguments, at most {MAX_COMMAND_ARGS}"
        )
    problem = task_input_problem((), sent.env)
    if problem is not None:
        raise InvalidRequest("spec.env", problem)
    problem = task_input_problem(sent.command, sent.env)
    if problem is not None:
        raise InvalidRequest("spec.command", problem)
    if not 0 <= sent.gpus <= MAX_GPUS:
        raise InvalidRequest("spec.gpus", f"{sent.gpus} is not 0 to {MAX_GPUS} cards")
    if not 0 <= sent.memory_bytes <= MAX_MEMORY_BYTES:
        raise InvalidRequest("spec.memory_bytes", f"{sent.memory_bytes} is not 0 to 64 TiB")
    if not 0 <= sent.cpu_millis <= MAX_CPU_MILLIS:
        raise InvalidRequest("spec.cpu_millis", f"{sent.cpu_millis} is not 0 to 4096 cores")
    if sent.image:
        try:
            ImageReference.parse(sent.image)
        except ImageReferenceError as exc:
            raise InvalidRequest("spec.image", str(exc)) from None
    problem = ready_path_problem(sent.ready_path)
    if problem is not None:
        raise InvalidRequest("spec.ready_path", problem)
    if not 1 <= sent.max_replicas <= MAX_ENDPOINT_REPLICAS:
        raise InvalidRequest(
            "spec.max_replicas", f"{sent.max_replicas} is not 1 to {MAX_ENDPOINT_REPLICAS}"
        )
    if not 0 <= sent.min_replicas <= sent.max_replicas:
        raise InvalidRequest(
            "spec.min_replicas",
            f"{sent.min_replicas} is not 0 to max_replicas ({sent.max_replicas})",
        )
    for field in ("idle_seconds", "cold_start_timeout_seconds", "request_timeout_seconds"):
        seconds = getattr(sent, field)
        if not 0 < seconds <= MAX_ENDPOINT_SECONDS:  # NaN too
            raise InvalidRequest(f"spec.{field}", f"{seconds} is not above 0 and at most a year")
    try:
        return spec_from_message(sent)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise InvalidRequest(f"spec.{field}", error["msg"]) from None


def _label(field: str, value: str, what: str) -> None:
    if not value:
        raise InvalidRequest(field, "missing")
    if not DNS_LABEL.fullmatch(value):
        raise InvalidRequest(field, f"{shown(value)} is not {what} (lowercase DNS label)")


def _missing(name: str) -> str:
    return f"no endpoint {name}: `levers9 endpoint list` shows them"


class EndpointsService(endpoints_pb2_grpc.EndpointsServicer):
    def __init__(self, records: TemporalEndpointRecords, authority: Authority) -> None:
        self._records = records
        self._authority = authority

    @staticmethod
    async def _name(context: Context, name: str) -> None:
        if not DNS_LABEL.fullmatch(name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"name: {shown(name)} is not an endpoint name (lowercase DNS label)",
            )

    async def _own(self, identity: Identity, name: str, context: Context) -> EndpointSpec:
        """The endpoint's spec when the caller may see it; NOT_FOUND, in the words of a missing
        endpoint, when there is none or it is another workspace's."""
        spec = await self._records.spec(name)
        if spec is None or not identity.sees(spec.workspace):
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(name))
        assert spec is not None
        return spec

    @staticmethod
    async def _unanswered(context: Context, exc: NoQueryAnswer) -> None:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"the controlplane's Temporal worker did not answer ({exc}): its endpoints are as"
            " created (levers9 endpoint list with the operator's token shows them)",
        )

    async def _workspace(self, identity: Identity, asked: str, context: Context) -> str:
        """The workspace the endpoint goes to (levers9.gateway.scope; to create in one the
        operator names, it must exist)."""
        return await call_workspace(
            self._authority,
            identity,
            asked,
            context,
            objects="endpoints",
            creating=True,
            field="spec.workspace",
        )

    async def CreateEndpoint(
        self, request: endpoints_pb2.CreateEndpointRequest, context: Context
    ) -> endpoints_pb2.CreateEndpointResponse:
        identity = await identify(self._authority, context)
        try:
            spec = submitted_endpoint(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        workspace = await self._workspace(identity, spec.workspace, context)
        spec = spec.model_copy(update={"workspace": workspace})
        unknown = await self._records.unknown_pool(spec.pool_name)
        if unknown is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec.pool_name: {unknown}")
        try:
            await self._records.create(spec)
        except EndpointExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        log.info(
            "endpoint created", endpoint=spec.name, workspace=workspace, pool_name=spec.pool_name
        )
        return endpoints_pb2.CreateEndpointResponse(spec=spec_message(spec))

    async def GetEndpoint(
        self, request: endpoints_pb2.GetEndpointRequest, context: Context
    ) -> endpoints_pb2.GetEndpointResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        await self._own(identity, request.name, context)
        try:
            view = await self._records.view(request.name)
        except NoQueryAnswer as exc:
            await self._unanswered(context, exc)
        if view is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(request.name))
        assert view is not None
        return endpoints_pb2.GetEndpointResponse(view=view_message(view))

    async def ListEndpoints(
        self, request: endpoints_pb2.ListEndpointsRequest, context: Context
    ) -> endpoints_pb2.ListEndpointsResponse:
        identity = await identify(self._authority, context)
        try:
            views = await self._records.views(identity.workspace)
        except NoQueryAnswer as exc:
            await self._unanswered(context, exc)
        # The visibility query filtered by workspace already; the spec is what decides.
        seen = [view for view in views if identity.sees(view.spec.workspace)]
        return endpoints_pb2.ListEndpointsResponse(views=[view_message(v) for v in seen])

    async def DeleteEndpoint(
        self, request: endpoints_pb2.DeleteEndpointRequest, context: Context
    ) -> endpoints_pb2.DeleteEndpointResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        wait = request.wait_seconds
        if not math.isfinite(wait) or wait < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "wait_seconds: a number of seconds, 0 or more"
            )
        spec = await self._own(identity, request.name, context)
        if not await self._records.delete(request.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(request.name))
        log.info("endpoint deleting", endpoint=request.name, workspace=spec.workspace)
        if wait == 0:
            return endpoints_pb2.DeleteEndpointResponse()
        view = await self._records.ended(request.name, min(wait, MAX_DELETE_WAIT_S))
        if view is None:
            return endpoints_pb2.DeleteEndpointResponse()
        return endpoints_pb2.DeleteEndpointResponse(ended=True, view=view_message(view))
