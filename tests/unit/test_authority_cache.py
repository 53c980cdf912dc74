"""The gateway's cache of workspace records (levers9.gateway.roles.Authority): a record is read
once within its bound; `forget` (a change made on this replica: `workspace set`, a token
revoked) makes the next read fetch it again; and a read that began before the change, and
ends after it, answers what it read but does not cache it (it would have kept the old limits,
max-queued among them, for the cache's bound)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import cast

from pydantic import SecretStr

from levers9.core.workspaces import WorkspaceState
from levers9.gateway.roles import Authority
from levers9.records.workspaces import TemporalWorkspaceRecords


class Records:
    """What the Authority reads a record from (the workspace workflow's memo in production):
    each `get` answers the record as it is when the read began, once `gate` opens."""

    def __init__(self) -> None:
        self.state = WorkspaceState(name="team", max_queued=None, created_at=datetime.now(UTC))
        self.reads = 0
        self.reading = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def get(self, name: str) -> WorkspaceState | None:
        self.reads += 1
        self.reading.set()
        seen = self.state
        await self.gate.wait()
        return seen


def _authority(records: Records) -> Authority:
    return Authority(
        SecretStr("s" * 32),
        workspaces=cast(TemporalWorkspaceRecords, records),
        cache_ttl_s=3600,
    )


async def test_a_record_is_read_once_and_again_after_forget() -> None:
    records = Records()
    authority = _authority(records)
    assert (await authority.workspace("team")) == records.state
    assert (await authority.workspace("team")) == records.state
    assert records.reads == 1
    records.state = records.state.model_copy(update={"max_queued": 1})
    authority.forget("team")
    got = await authority.workspace("team")
    assert got is not None
    assert got.max_queued == 1
    assert records.reads == 2


async def test_a_read_begun_before_a_change_is_not_cached_past_it() -> None:
    records = Records()
    authority = _authority(records)
    records.gate.clear()
    early = asyncio.create_task(authority.workspace("team"))
    await records.reading.wait()
    # The change lands while the early read is in flight.
    records.state = records.state.model_copy(update={"max_queued": 1})
    authority.forget("team")
    records.gate.set()
    old = await early
    assert old is not None
    assert old.max_queued is None, "it answers what it read"
    now = await authority.workspace("team")
    assert now is not None
    assert now.max_queued == 1, "the next read is not the stale one"
    assert records.reads == 2
