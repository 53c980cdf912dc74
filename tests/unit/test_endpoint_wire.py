"""An endpoint's fields are defined once: the proto messages of levers9/proto/endpoints.proto
name the fields of levers9.core.endpoints' models (EndpointSpec, Replica, ScaleEvent,
EndpointView), and levers9.endpoint_wire carries every one of them both ways, to the same
`endpoint get -o json`. A field added to one side and not the other fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from levers9.core.endpoints import EndpointSpec, EndpointView, Replica, ScaleEvent
from levers9.endpoint_wire import spec_from_message, spec_message, view_from_message, view_message
from levers9.proto import endpoints_pb2

NOW = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
EVERY_FIELD = EndpointSpec(
    name="chat",
    pool_name="gke-rtx6000",
    command=("python", "-m", "server"),
    port=8080,
    image="127.0.0.1:5000/tasks/busybox:bb",
    gpus=2,
    env={"MODEL": "small"},
    memory_bytes=8 * 2**30,
    cpu_millis=4000,
    min_replicas=1,
    max_replicas=3,
    target_in_flight=2,
    idle_seconds=60.5,
    ready_path="/health",
    cold_start_timeout_seconds=900,
    request_timeout_seconds=1200,
    public=True,
    workspace="team-a",
    borrow=True,
)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (EndpointSpec, endpoints_pb2.EndpointSpec),
        (Replica, endpoints_pb2.EndpointReplica),
        (ScaleEvent, endpoints_pb2.EndpointEvent),
        (EndpointView, endpoints_pb2.EndpointView),
    ],
)
def test_each_message_names_its_models_fields(
    model: type[BaseModel], message: type[Message]
) -> None:
    assert set(message.DESCRIPTOR.fields_by_name) == set(model.model_fields)


def test_a_spec_crosses_the_wire_whole() -> None:
    for field in EndpointSpec.model_fields:  # no field left at its default
        assert getattr(EVERY_FIELD, field) != EndpointSpec.model_fields[field].default, field
    assert spec_from_message(spec_message(EVERY_FIELD)) == EVERY_FIELD


def test_a_view_crosses_the_wire_whole_an_unset_time_as_none() -> None:
    view = EndpointView(
        name="chat",
        spec=EVERY_FIELD,
        created_at=NOW,
        replicas=[
            Replica(task_id="t1", state="ready", started_at=NOW, ready_at=NOW + timedelta(9)),
            Replica(task_id="t2", started_at=NOW + timedelta(seconds=1)),
        ],
        in_flight=3,
        waiting=1,
        wanted=2,
        failing="3 replicas in a row ended before they were ready",
        cold_starts=4,
        events=[ScaleEvent(at=NOW, kind="cold start", message="1 request(s) waiting")],
        deleted=True,
    )
    crossed = view_from_message(view_message(view))
    assert crossed == view
    assert crossed.replicas[1].ready_at is None
    assert crossed.model_dump_json() == view.model_dump_json()


def test_a_spec_out_of_range_is_refused_naming_the_field() -> None:
    message = spec_message(EVERY_FIELD)
    message.idle_seconds = 0
    with pytest.raises(ValidationError, match="idle_seconds"):
        spec_from_message(message)
