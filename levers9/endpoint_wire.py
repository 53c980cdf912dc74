"""An endpoint on the wire (levers9/proto/endpoints.proto): its spec, which `levers9 endpoint
create` sends (Endpoints.CreateEndpoint), and its view, which `endpoint get` and `list` read.
The messages name the fields of levers9.core.endpoints' models; the converters copy every field
by its name (levers9.task_wire's `to_message` / `from_message`), never a hand list, and
tests/unit/test_endpoint_wire.py fails while a model field has no wire field.

Pure: no checks here; the gateway checks what a client sends (levers9.gateway.endpoint_service).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from levers9.core.endpoints import EndpointSpec, EndpointView, Replica, ScaleEvent
from levers9.proto import endpoints_pb2
from levers9.task_wire import from_message, to_message

NESTED: Mapping[str, type[BaseModel]] = {
    endpoints_pb2.EndpointSpec.DESCRIPTOR.full_name: EndpointSpec,
    endpoints_pb2.EndpointReplica.DESCRIPTOR.full_name: Replica,
    endpoints_pb2.EndpointEvent.DESCRIPTOR.full_name: ScaleEvent,
}
"""The model each nested message of a view becomes."""


def spec_message(spec: EndpointSpec) -> endpoints_pb2.EndpointSpec:
    return to_message(spec, endpoints_pb2.EndpointSpec)


def spec_from_message(message: endpoints_pb2.EndpointSpec) -> EndpointSpec:
    """The spec a message carries (pydantic's ValidationError for a value out of range)."""
    return from_message(message, EndpointSpec, nested=NESTED)


def view_message(view: EndpointView) -> endpoints_pb2.EndpointView:
    return to_message(view, endpoints_pb2.EndpointView)


def view_from_message(message: endpoints_pb2.EndpointView) -> EndpointView:
    return from_message(message, EndpointView, nested=NESTED)
