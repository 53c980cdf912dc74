"""The endpoint autoscaler (`levers9.core.endpoints`, pure): what it decides from the gateways'
reports, with the clock in the test's hands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from levers9.core.endpoints import (
    FAILING_AFTER,
    LOAD_STALE,
    EndpointSpec,
    EndpointState,
    EndpointView,
    Load,
    compute_capability,
    vllm_environment,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _state(**spec: object) -> EndpointState:
    base: dict[str, object] = {
        "name": "llm",
        "pool_name": "gke",
        "command": ("serve",),
        "port": 8080,
    }
    return EndpointState(spec=EndpointSpec.model_validate(base | spec), created_at=T0)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_nothing_runs_at_zero_until_a_request_waits_then_one_cold_start() -> None:
    state = _state(max_replicas=3)
    assert state.decide(_at(0)).start == 0
    state.take_load(Load(gateway="a", waiting=1), _at(1))
    decision = state.decide(_at(1))
    assert (decision.kind, decision.start) == ("cold start", 1)
    assert decision.message == "1 request(s) waiting and no replica: starting 1"


def test_a_starting_replica_is_never_stopped_for_want_of_requests() -> None:
    """The page's failure: the caller gave up, zero in flight, the container stopped and its
    pull cancelled. Here the replica starts and stays, however long it takes."""
    state = _state(idle_seconds=5)
    state.take_load(Load(gateway="a", waiting=1), _at(0))
    state.decide(_at(0))
    state.started("r1", _at(0))
    state.take_load(Load(gateway="a"), _at(1))  # the caller gave up
    for second in range(2, 3600, 60):
        assert state.decide(_at(second)).stop == []
    state.replica_ready("r1", _at(3600))
    assert state.replicas["r1"].state == "ready"
    assert state.decide(_at(3601)).stop == []  # the idle time starts now
    assert state.decide(_at(3607)).stop == ["r1"]


def test_concurrent_requests_scale_up_to_max_and_idle_scales_down_to_min() -> None:
    state = _state(min_replicas=1, max_replicas=3, target_in_flight=2, idle_seconds=10)
    state.started("r1", _at(0))
    state.replica_ready("r1", _at(1))
    state.take_load(Load(gateway="a", in_flight=3), _at(2))
    state.take_load(Load(gateway="b", in_flight=3, waiting=1), _at(2))
    decision = state.decide(_at(2))
    assert (decision.kind, decision.start) == ("scale up", 2)  # ceil(7 / 2) = 4, max 3
    state.started("r2", _at(2))
    state.started("r3", _at(2))
    state.replica_ready("r2", _at(3))
    state.replica_ready("r3", _at(4))
    state.take_load(Load(gateway="a"), _at(5))
    state.take_load(Load(gateway="b"), _at(5))
    assert state.decide(_at(5)).stop == []
    assert state.decide(_at(14)).stop == []
    decision = state.decide(_at(15))
    assert decision.kind == "scale down"
    assert decision.stop == ["r3", "r2"]  # the newest first, down to min 1
    assert decision.message == "0 in flight for 10 s: 3 -> 1"


def test_a_gateway_that_died_holding_requests_counts_for_nothing_after_a_while() -> None:
    state = _state(max_replicas=2, target_in_flight=1)
    state.take_load(Load(gateway="dead", in_flight=2), _at(0))
    assert state.demand(_at(1)) == (2, 0)
    assert state.demand(_at(0) + LOAD_STALE) == (0, 0)
    wake = state.next_wake(_at(1))
    assert wake == LOAD_STALE - timedelta(seconds=1)


def test_replicas_failing_before_ready_make_the_endpoint_failing_with_backoff() -> None:
    state = _state()
    state.take_load(Load(gateway="a", waiting=1), _at(0))
    for attempt in range(FAILING_AFTER):
        decision = state.decide(_at(attempt))
        assert decision.start == 1
        state.started(f"r{attempt}", _at(attempt))
        state.replica_ended(f"r{attempt}", "failed", "exited with code 1", _at(attempt))
    assert "3 replicas in a row ended before they were ready" in state.failing
    assert "exited with code 1" in state.failing
    assert state.decide(_at(FAILING_AFTER)).start == 0  # backing off
    assert state.decide(_at(FAILING_AFTER + 11)).start == 1
    state.started("ok", _at(20))
    state.replica_ready("ok", _at(21))
    assert state.failing == ""


def test_a_stopped_replica_ending_is_not_a_failure() -> None:
    state = _state()
    state.started("r1", _at(0))
    state.replica_ready("r1", _at(1))
    state.stopping("r1")
    state.replica_ended("r1", "cancelled", "scaled down", _at(2))
    assert state.failures == 0
    assert state.replicas == {}
    assert state.events[-1].message == "replica r1 stopped (cancelled)"


def test_the_view_names_ready_replicas_and_the_wanted_count() -> None:
    state = _state(max_replicas=2, target_in_flight=1)
    state.started("r1", _at(0))
    state.replica_ready("r1", _at(1))
    state.started("r2", _at(1))
    state.take_load(Load(gateway="a", in_flight=2), _at(2))
    view = EndpointView.of(state, _at(2))
    assert view.replicas_ready() == ["r1"]
    assert (view.in_flight, view.waiting, view.wanted) == (2, 0, 2)


@pytest.mark.parametrize(
    ("gpu_type", "capability"),
    [
        ("RTXPro6000", 12.0),
        ("B200", 10.0),
        ("nvidia-h100-80gb", 9.0),
        ("nvidia-l4", 8.9),
        ("mystery-card", None),
    ],
)
def test_compute_capability_by_the_pools_gpu_type(gpu_type: str, capability: float | None) -> None:
    assert compute_capability(gpu_type) == capability


def test_the_vllm_row_applies_on_blackwell_unless_the_user_set_it() -> None:
    assert vllm_environment({}, 12.0) == {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
    assert vllm_environment({"A": "1"}, 10.0) == {"A": "1", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
    mine = {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    assert vllm_environment(mine, 12.0) == mine
    assert vllm_environment({}, 9.0) == {}
    assert vllm_environment({}, None) == {}


def test_it_never_wakes_without_cause_while_a_surplus_replica_still_starts() -> None:
    """A surplus that only a starting replica makes: nothing to stop, nothing to wake for (the
    replica's `ready` report wakes the workflow), so no workflow task every 100 ms."""
    state = _state(idle_seconds=5)
    state.started("r1", _at(0))
    state.take_load(Load(gateway="a"), _at(0))
    state.decide(_at(1))
    assert state.next_wake(_at(1)) == timedelta(seconds=5)
    state.decide(_at(40))
    assert state.next_wake(_at(40)) is None
    state.replica_ready("r1", _at(50))
    assert state.next_wake(_at(50)) == timedelta(seconds=5)
