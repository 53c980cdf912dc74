"""Worker requests checked and converted (pure): every refusal names its proto field, advertised
addresses must be IP literals (the spec's `dial tcp: lookup <node>`), sizes are bounded, and
what passes becomes the record the workflow gets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from pydantic import SecretStr

from levers9.core.task_reports import TaskState
from levers9.gateway import convert
from levers9.gateway.errors import InvalidRequest
from levers9.proto import worker_pb2
from tests.gateway.agents import Agent


def _refusal(convert: Callable[[], object]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        convert()
    assert caught.value.message.startswith(f"{caught.value.field}: ")
    return caught.value


@pytest.fixture
def agent() -> Agent:
    return Agent.new(SecretStr("unit"))


@pytest.mark.parametrize(
    "address", ["203.0.113.7:50051", "127.0.0.9:1", "[2001:db8::7]:50051", "[::1]:65535"]
)
def test_ip_literal_addresses_pass(address: str) -> None:
    convert.check_address("advertised_address", address)


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("gke-rtx6000-pool-4f2a-node-1:50051", "dial tcp: lookup"),
        ("node-1.c.project.internal:50051", "dial tcp: lookup"),
        ("203.0.113.7", "host:port"),
        ("203.0.113.7:", "host:port"),
        (":50051", "host:port"),
        ("203.0.113.7:0", "host:port"),
        ("203.0.113.7:65536", "host:port"),
        ("203.0.113.7:http", "host:port"),
        ("2001:db8::7:50051", "brackets"),
        ("[203.0.113.7]:50051", "brackets"),
        ("0.0.0.0:50051", "unspecified"),
        ("[::]:50051", "unspecified"),
        ("", "host:port"),
    ],
)
def test_other_addresses_are_refused(address: str, problem: str) -> None:
    refusal = _refusal(lambda: convert.check_address("advertised_address", address))
    assert refusal.field == "advertised_address"
    assert problem in refusal.message


def test_registration(agent: Agent) -> None:
    record = convert.registration(agent.register(gpus=4, visible_devices=[0, 1, 2, 3]))

    assert record.worker_id == agent.worker_id
    assert record.address == "203.0.113.7:50051"
    assert (record.gpus, record.visible_devices) == (4, (0, 1, 2, 3))
    assert not record.tls


def test_the_checkpoint_capability_is_kept_and_long_words_cut_never_refused(
    agent: Agent,
) -> None:
    assert convert.registration(agent.register(checkpoint="runsc")).checkpoint == "runsc"
    said = "none (runsc: runsc is not installed; criu check: " + "x" * 5000 + ")"
    kept = convert.registration(agent.register(checkpoint=said)).checkpoint
    assert kept == said[: convert.MAX_CHECKPOINT_CHARS]
    assert convert.registration(agent.register()).checkpoint == ""


def test_a_tls_worker_is_dialed_with_tls_unless_tunnelled(agent: Agent) -> None:
    assert convert.registration(agent.register(tls=True)).tls
    tunnelled = convert.registration(
        agent.register(tls=True, tunnel=True, advertised_address=""),
        convert.TunnelEndpoint("unix:/tmp/t.sock", "q1", "10.0.0.5:7443"),
    )
    assert (tunnelled.address, tunnelled.tls) == ("unix:/tmp/t.sock", False)
    assert (tunnelled.task_queue, tunnelled.replica_address) == ("q1", "10.0.0.5:7443")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pool_name": ""}, "pool_name"),
        ({"pool_name": "GKE_pool"}, "pool_name"),
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": "a" * 64}, "worker_id"),
        ({"worker_id": "w:1"}, "worker_id"),
        ({"node_name": ""}, "node_name"),
        ({"node_name": "node 1"}, "node_name"),
        ({"pod_uid": ""}, "pod_uid"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": 65}, "gpus"),
        ({"visible_devices": [0, 0]}, "visible_devices"),
        ({"visible_devices": [-1]}, "visible_devices"),
        ({"visible_devices": list(range(65))}, "visible_devices"),
        ({"gpu_product": "x" * 257}, "gpu_product"),
        ({"agent_version": "x" * 257}, "agent_version"),
    ],
)
def test_invalid_registration_names_the_field(
    agent: Agent, fields: dict[str, Any], field: str
) -> None:
    assert _refusal(lambda: convert.registration(agent.register(**fields))).field == field


def test_a_long_value_is_clipped_in_the_message(agent: Agent) -> None:
    request = agent.register(advertised_address="n" * 100_000 + ":1")
    assert len(_refusal(lambda: convert.registration(request)).message) < 400


def test_heartbeat_idle_since(agent: Agent) -> None:
    idle = convert.heartbeat(agent.heartbeat(idle_since_unix_ms=1_789_000_000_250))
    busy = convert.heartbeat(agent.heartbeat(running_tasks=2, idle_since_unix_ms=0))

    assert idle.idle_since == datetime(2026, 9, 10, 0, 26, 40, 250_000, tzinfo=UTC)
    assert (busy.running_tasks, busy.idle_since) == (2, None)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"running_tasks": -1}, "running_tasks"),
        ({"running_tasks": 5000}, "running_tasks"),
        ({"idle_since_unix_ms": -5}, "idle_since_unix_ms"),
        ({"idle_since_unix_ms": 2**62}, "idle_since_unix_ms"),
        ({"worker_id": ""}, "worker_id"),
    ],
)
def test_invalid_heartbeat_names_the_field(
    agent: Agent, fields: dict[str, Any], field: str
) -> None:
    assert _refusal(lambda: convert.heartbeat(agent.heartbeat(**fields))).field == field


@pytest.mark.parametrize(
    ("state", "name"),
    [
        (worker_pb2.TASK_STATE_RUNNING, "running"),
        (worker_pb2.TASK_STATE_SUCCEEDED, "succeeded"),
        (worker_pb2.TASK_STATE_FAILED, "failed"),
        (worker_pb2.TASK_STATE_CANCELLED, "cancelled"),
        (worker_pb2.TASK_STATE_LOST, "lost"),
    ],
)
def test_every_task_state_has_a_name(agent: Agent, state: int, name: str) -> None:
    assert convert.task_report(agent.report("t-1", state=state)).state == name


def test_state_names_are_the_task_states(agent: Agent) -> None:
    names = {
        convert.task_report(agent.report("t-1", state=value)).state
        for value in worker_pb2.TaskState.values()
        if value != worker_pb2.TASK_STATE_UNSPECIFIED
    }
    assert names == set(get_args(TaskState))


def test_report_carries_the_reporting_worker(agent: Agent) -> None:
    report = convert.task_report(
        agent.report("t-1", state=worker_pb2.TASK_STATE_FAILED, exit_code=3, reason="OOM")
    )
    assert (report.pool_name, report.worker_id, report.task_id) == (
        agent.pool_name,
        agent.worker_id,
        "t-1",
    )
    assert (report.state, report.exit_code, report.reason) == ("failed", 3, "OOM")


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"task_id": ""}, "status.task_id"),
        ({"task_id": "task one"}, "status.task_id"),
        ({"state": worker_pb2.TASK_STATE_UNSPECIFIED}, "status.state"),
        ({"state": 99}, "status.state"),
        ({"result_json": "x" * (128 * 1024 + 1)}, "status.result_json"),
        ({"reason": "é" * (8 * 1024 + 1)}, "status.reason"),
        ({"log_tail": "x" * (64 * 1024 + 1)}, "status.log_tail"),
        ({"phases": [worker_pb2.Phase(name="p")] * 65}, "status.phases"),
        ({"phases": [worker_pb2.Phase(name="")]}, "status.phases[0].name"),
        ({"phases": [worker_pb2.Phase(name="p", at_unix_ms=-1)]}, "status.phases[0].at_unix_ms"),
        ({"phases": [worker_pb2.Phase(name="p", error="e" * 4096)]}, "status.phases[0].error"),
    ],
)
def test_invalid_report_names_the_field(agent: Agent, status: dict[str, Any], field: str) -> None:
    request = agent.report(**({"task_id": "t-1"} | status))
    assert _refusal(lambda: convert.task_report(request)).field == field


def test_report_without_status(agent: Agent) -> None:
    request = agent.report("t-1")
    request.ClearField("status")
    assert _refusal(lambda: convert.task_report(request)).message == "status: missing"
