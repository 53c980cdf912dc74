"""What this gateway knows of each endpoint and tells its autoscaler.

Per endpoint (`EndpointState`): its view (`EndpointWorkflow`'s query `view`, read again beside
the requests once older than `VIEW_TTL_S`: a warm request never waits on Temporal), its
replicas' streams (closed once a replica leaves the ready ones), its requests in flight and
waiting. `EndpointViews` picks the ready replica a request goes to (the fewest in flight from
here), or holds the request through a cold start until one is ready (503 past the endpoint's
`cold_start_timeout_seconds`, or at once while its replicas keep failing); reads a replica's
record (Temporal not answering: tried again for a moment, then 503); and reports this
gateway's load to the autoscaler (signal `load`). `EndpointBook` is what it reads and tells:
Temporal in production (`TemporalEndpointBook`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from temporalio.client import Client
from temporalio.exceptions import TemporalError

from levers9.core.endpoints import EndpointView, Load
from levers9.gateway.endpoint_messages import Refused
from levers9.gateway.replica_streams import Replica
from levers9.logs import get_logger
from levers9.models import TaskRecord
from levers9.records.endpoints import query_endpoint, report_load
from levers9.records.tasks import task_record

# The front's log: what this module logs is the endpoints' front's doing.
log = get_logger("levers9.gateway.endpoint_proxy")

VIEW_TTL_S = 1.0
WAIT_POLL_S = 0.2
RECORD_READS = 5
"""Reads of a replica's record Temporal did not answer, WAIT_POLL_S apart and doubling (3 s
in all), before its request is refused 503."""
REPORT_SPACING_S = 1.0
REPORT_REPEAT_S = 10.0
"""While this gateway holds requests of an endpoint it repeats its report (the autoscaler drops
reports older than 30 s: a gateway that died holding requests)."""


class EndpointBook(Protocol):
    """What the front reads and tells (Temporal in production)."""

    async def view(self, name: str) -> EndpointView | None: ...

    async def report(self, name: str, load: Load) -> bool: ...

    async def task(self, task_id: str) -> TaskRecord | None: ...


class TemporalEndpointBook:
    """Endpoints and task records as Temporal holds them."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def view(self, name: str) -> EndpointView | None:
        return await query_endpoint(self._client, name)

    async def report(self, name: str, load: Load) -> bool:
        return await report_load(self._client, name, load)

    async def task(self, task_id: str) -> TaskRecord | None:
        return await task_record(self._client, task_id)


@dataclass
class EndpointState:
    """One endpoint as this gateway holds it."""

    name: str
    view: EndpointView | None = None
    fetched: float = 0.0
    in_flight: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    replicas: dict[str, Replica] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    reporter: asyncio.Task[None] | None = None
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)
    refresher: asyncio.Task[None] | None = None

    peak: int = 0
    """The most requests in flight at once since the last report."""

    def total(self) -> int:
        return sum(self.in_flight.values())


class EndpointViews:
    """This gateway's endpoints, as its requests need them."""

    def __init__(
        self,
        book: EndpointBook,
        gateway_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._book = book
        self._gateway_id = gateway_id
        self._clock = clock
        self._endpoints: dict[str, EndpointState] = {}

    async def stop(self) -> None:
        """Its report and view reads stopped, its replicas' streams closed."""
        for endpoint in self._endpoints.values():
            if endpoint.reporter is not None:
                endpoint.reporter.cancel()
            if endpoint.refresher is not None:
                endpoint.refresher.cancel()
            for replica in endpoint.replicas.values():
                await replica.close()

    async def endpoint(self, name: str, *, fresh: bool = False) -> EndpointState:
        """The endpoint, its view read now when this gateway has none (or `fresh`, while a
        request waits for a replica); an older one than VIEW_TTL_S serves this request while it
        is read again beside it (a warm request never waits on Temporal)."""
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            endpoint = self._endpoints[name] = EndpointState(name)
        if endpoint.view is None or fresh:
            await self._refresh(endpoint, VIEW_TTL_S if not fresh else WAIT_POLL_S)
        elif self._clock() - endpoint.fetched >= VIEW_TTL_S and (
            endpoint.refresher is None or endpoint.refresher.done()
        ):
            endpoint.refresher = asyncio.create_task(self._refresh(endpoint, VIEW_TTL_S))
        if endpoint.view is None:
            raise Refused(404, f"no endpoint {name}: `levers9 endpoint list` shows them")
        return endpoint

    async def _refresh(self, endpoint: EndpointState, ttl: float) -> None:
        async with endpoint.refreshing:
            if endpoint.view is not None and self._clock() - endpoint.fetched < ttl:
                return
            try:
                view = await self._book.view(endpoint.name)
            except Exception as exc:
                if endpoint.view is None:
                    raise Refused(503, f"endpoint {endpoint.name}: Temporal: {exc}") from None
                return  # serve from the last view
            endpoint.view, endpoint.fetched = view, self._clock()
            ready = set(view.replicas_ready()) if view is not None else set()
            for task_id in list(endpoint.replicas):
                if task_id not in ready:
                    await endpoint.replicas.pop(task_id).close()

    async def replica(self, endpoint: EndpointState, tried: set[str]) -> str:
        """A ready replica (not one of `tried`), with the fewest requests from here in
        flight; waits for one."""
        view = endpoint.view
        assert view is not None
        ready = [t for t in view.replicas_ready() if t not in tried]
        if ready:
            return min(ready, key=lambda t: (endpoint.in_flight.get(t, 0), t))
        deadline = self._clock() + view.spec.cold_start_timeout_seconds
        endpoint.waiting += 1
        self.report(endpoint, urgent=endpoint.waiting == 1)
        try:
            while True:
                if view.failing:
                    raise Refused(503, f"endpoint {endpoint.name}: {view.failing}")
                left = deadline - self._clock()
                if left <= 0:
                    raise Refused(
                        503,
                        f"endpoint {endpoint.name}: no replica ready after"
                        f" {view.spec.cold_start_timeout_seconds:g} s (`levers9 endpoint get"
                        f" {endpoint.name}` shows its replicas)",
                    )
                await asyncio.sleep(min(WAIT_POLL_S, left))
                endpoint = await self.endpoint(endpoint.name, fresh=True)
                view = endpoint.view
                assert view is not None
                ready = [t for t in view.replicas_ready() if t not in tried]
                if ready:
                    return min(ready, key=lambda t: (endpoint.in_flight.get(t, 0), t))
        finally:
            endpoint.waiting -= 1
            self.report(endpoint)

    async def record(self, endpoint: EndpointState, task_id: str) -> TaskRecord | None:
        """The replica's record; Temporal not answering for it (a controlplane or server just
        restarted) is tried again for a moment, then refused 503 saying so."""
        for attempt in range(RECORD_READS):
            try:
                return await self._book.task(task_id)
            except TemporalError as exc:
                if attempt + 1 == RECORD_READS:
                    raise Refused(
                        503,
                        f"endpoint {endpoint.name}: the record of replica {task_id} cannot be"
                        f" read now (Temporal: {exc}); try again",
                    ) from None
                await asyncio.sleep(WAIT_POLL_S * 2**attempt)
        raise AssertionError("unreachable")

    # -- reports to the autoscaler -----------------------------------------------------------

    def report(self, endpoint: EndpointState, *, urgent: bool = False) -> None:
        """Its numbers changed: reported (at once when `urgent`, a first request waiting)."""
        if endpoint.reporter is None or endpoint.reporter.done():
            endpoint.reporter = asyncio.create_task(self._reporting(endpoint))
        if urgent:
            endpoint.wake.set()

    async def _reporting(self, endpoint: EndpointState) -> None:
        """Sends this gateway's numbers when they change (at most one a second, at once when a
        first request starts waiting), again every REPORT_REPEAT_S while not zero, and a last
        zero; then ends (the next request starts it again). In flight is the most at once since
        the last report: requests one after another are 1 for the autoscaler, not a 0 or a 1
        depending on the instant (and a signal each time it flips)."""
        sent: tuple[int, int] | None = None
        last = 0.0
        while True:
            now = (max(endpoint.peak, endpoint.total()), endpoint.waiting)
            endpoint.peak = endpoint.total()
            if now != sent or (now != (0, 0) and self._clock() - last >= REPORT_REPEAT_S):
                load = Load(gateway=self._gateway_id, in_flight=now[0], waiting=now[1])
                try:
                    await self._book.report(endpoint.name, load)
                    sent, last = now, self._clock()
                except Exception as exc:
                    log.warning(
                        "endpoint load not reported", endpoint=endpoint.name, error=str(exc)
                    )
            if sent == (0, 0):
                return
            endpoint.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_SPACING_S):
                    await endpoint.wake.wait()
            if endpoint.wake.is_set():
                continue
