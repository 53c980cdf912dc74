"""The endpoints' front when Temporal does not answer for a replica's record (the controlplane
or the server just restarted): the request is tried again for a moment, then answered 503 naming
the replica and what Temporal said, never aiohttp's bare 500. The front is the real one on a
socket; what it reads from Temporal comes from a book that fails as the client did in
benchmarks/faults.py (RPCError `context canceled` right after a restart)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import aiohttp
from pydantic import SecretStr
from temporalio.service import RPCError, RPCStatusCode

from levers9.core.endpoints import EndpointSpec, EndpointView, Load, Replica
from levers9.gateway.endpoint_proxy import EndpointProxy
from levers9.gateway.endpoint_views import RECORD_READS
from levers9.gateway.task_service import TasksService
from levers9.models import TaskRecord
from levers9.tokens import operator_token

SECRET = "front-token-secret-0123456789abcdef"


class _Unanswered:
    """An endpoint with one ready replica whose record Temporal never answers for."""

    def __init__(self) -> None:
        now = datetime.now(UTC)
        spec = EndpointSpec(name="ep", pool_name="pool", command=("serve",), port=8000)
        self._view = EndpointView(
            name="ep",
            spec=spec,
            created_at=now,
            replicas=[Replica(task_id="ep-r1", state="ready", started_at=now, ready_at=now)],
            in_flight=0,
            waiting=0,
            wanted=1,
            events=[],
        )
        self.reads = 0

    async def view(self, name: str) -> EndpointView | None:
        return self._view if name == "ep" else None

    async def report(self, name: str, load: Load) -> bool:
        return True

    async def task(self, task_id: str) -> TaskRecord | None:
        self.reads += 1
        raise RPCError("context canceled", RPCStatusCode.CANCELLED, b"")


async def test_a_replica_record_temporal_does_not_answer_for_is_a_503_that_says_so() -> None:
    book = _Unanswered()
    # No replica is dialled: the request stops at the record.
    proxy = EndpointProxy(book, cast(TasksService, None), SecretStr(SECRET), "front-test")
    port = await proxy.start("127.0.0.1:0")
    try:
        headers = {"Authorization": f"Bearer {operator_token(SECRET)}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/ep/x", headers=headers) as response,
        ):
            status, text = response.status, await response.text()
    finally:
        await proxy.stop()
    assert status == 503, text
    assert "the record of replica ep-r1 cannot be read now" in text
    assert "context canceled" in text
    assert book.reads == RECORD_READS


async def test_a_websocket_handshake_is_refused_501_before_any_replica_is_read() -> None:
    """docs/endpoints.md: WebSockets are not proxied; the handshake is answered at the door,
    after the token is checked, its replica's record never read (the sandbox test shows no
    cold start for it)."""
    book = _Unanswered()
    proxy = EndpointProxy(book, cast(TasksService, None), SecretStr(SECRET), "front-test")
    port = await proxy.start("127.0.0.1:0")
    handshake = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    answers = []
    try:
        async with aiohttp.ClientSession() as session:
            for token in (operator_token(SECRET), "not-the-token"):
                headers = {**handshake, "Authorization": f"Bearer {token}"}
                url = f"http://127.0.0.1:{port}/ep/chat"
                async with session.get(url, headers=headers) as response:
                    answers.append((response.status, await response.text()))
    finally:
        await proxy.stop()
    (status, text), (unauthorized, _) = answers
    assert status == 501, text
    assert text.startswith("endpoint ep: WebSockets are not proxied"), text
    assert unauthorized == 401
    assert book.reads == 0
