"""A pool's state carried across continue-as-new (PoolInput.carrying / carried): as it is while
small, packed when long, and within Temporal's 2 MB payload limit at the most tasks a pool keeps
waiting (POOL_MAX_WAITING), as the controlplane's data converter encodes it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter

from levers9.core.placement import PoolState, Slot
from levers9.models import PACK_STATE_OVER, PACKED, POOL_MAX_WAITING, PoolInput

TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024
SINCE = datetime(2026, 12, 5, tzinfo=UTC)


def _queue(waiting: int) -> PoolState:
    state = PoolState()
    for n in range(200):
        state.add_worker(
            Slot(worker_id=f"w{n}", node_name=f"gke-pool-gpu-{n}", address="", devices=(0,))
        )
    for n in range(waiting):
        state.request(
            uuid.uuid4().hex[:12],
            1 + n % 4,
            SINCE + timedelta(milliseconds=n),
            notify=True,
            workspace=f"team-{n % 20:02d}",
        )
    return state


def test_a_small_state_is_carried_as_it_is() -> None:
    state = _queue(10)
    carrying = PoolInput(pool_name="p").carrying(state)
    assert carrying.packed_state is None
    assert carrying.state == state
    back = carrying.carried()
    assert back is not None
    assert back.model_dump() == state.model_dump()


def test_a_long_queue_is_packed_and_comes_back_whole() -> None:
    state = _queue(2_000)
    assert len(state.model_dump_json()) > PACK_STATE_OVER
    carrying = PoolInput(pool_name="p", max_history_events=100).carrying(state)
    assert carrying.state == PACKED
    assert carrying.packed_state is not None
    assert carrying.max_history_events == 100
    back = carrying.carried()
    assert back is not None
    assert [w.task_id for w in back.waiting] == [w.task_id for w in state.waiting]
    assert back.model_dump() == state.model_dump()


def test_the_most_a_pool_keeps_waiting_fits_one_payload() -> None:
    state = _queue(POOL_MAX_WAITING)
    plain = pydantic_data_converter.payload_converter.to_payloads(
        [PoolInput(pool_name="p", state=state)]
    )
    assert plain[0].ByteSize() > TEMPORAL_PAYLOAD_LIMIT  # what a run could not continue with
    carrying = PoolInput(pool_name="p").carrying(state)
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([carrying])
    assert payload.ByteSize() < TEMPORAL_PAYLOAD_LIMIT * 3 // 4, payload.ByteSize()


class PoolInputBeforePacking(BaseModel):
    """PoolInput as the code before packing reads it (pydantic ignores fields it does not know)."""

    pool_name: str
    state: PoolState | None = None
    max_history_events: int = 5_000


def test_code_before_packing_cannot_read_a_packed_state_rather_than_start_empty() -> None:
    """A Temporal worker of the code before packing, in a rolling upgrade, fails to decode the
    continued run's input (its workflow task fails and is retried until a replica of this code
    takes it) instead of reading `state` as None and starting the pool with no queue."""
    carrying = PoolInput(pool_name="p").carrying(_queue(2_000))
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([carrying])
    with pytest.raises(Exception, match="state"):
        pydantic_data_converter.payload_converter.from_payloads([payload], [PoolInputBeforePacking])
    small = PoolInput(pool_name="p").carrying(_queue(10))
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([small])
    (read,) = pydantic_data_converter.payload_converter.from_payloads(
        [payload], [PoolInputBeforePacking]
    )
    assert read.state is not None
    assert len(read.state.waiting) == 10
