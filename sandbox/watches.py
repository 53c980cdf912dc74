"""Watch events and subscriptions: what the store fans out and how each watcher sees it.

A `StoredEvent` is one committed change, carrying the object's serialized bytes (shared by
every watcher) and its labels and field values before and after, so a watcher with a selector
can tell an object entering the selection (ADDED), changing in it (MODIFIED) or leaving it
(DELETED), as the apiserver's watch cache does.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sandbox.resources import Resource
from sandbox.selectors import FieldSelector, LabelSelector

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes, the form objects are stored and served in."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One committed change. `prev_*` describe the object before a MODIFIED or DELETED."""

    type: EventType
    resource: Resource
    namespace: str
    name: str
    rv: int
    uid: str
    raw: bytes
    labels: dict[str, str]
    fields: dict[str, str]
    prev_raw: bytes | None = None
    prev_labels: dict[str, str] | None = None
    prev_fields: dict[str, str] | None = None
    owners: tuple[str, ...] = ()

    def object(self) -> dict[str, Any]:
        """A private copy of the object as of this event."""
        result: dict[str, Any] = json.loads(self.raw)
        return result


def matches(
    labels: dict[str, str],
    fields: dict[str, str],
    label_selector: LabelSelector | None,
    field_selector: FieldSelector | None,
) -> bool:
    if label_selector is not None and not label_selector.matches(labels):
        return False
    return field_selector is None or field_selector.matches(fields)


class Watch:
    """One subscription: an async iterator of `StoredEvent`s, filtered like the apiserver's.

    An update that moves an object into the selector arrives as ADDED, out of it as DELETED.
    The iteration ends when the watch is closed or falls `queue_limit` events behind (the
    apiserver drops a watcher that cannot keep up; the client re-watches from its last rv).
    """

    def __init__(
        self,
        resource: Resource,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        queue_limit: int,
        on_close: Callable[[Watch], None],
    ) -> None:
        self.resource = resource
        self._on_close = on_close
        self._namespace = namespace
        self._labels = labels
        self._fields = fields
        self._limit = queue_limit
        self._queue: deque[StoredEvent] = deque()
        self._ready = asyncio.Event()
        self.closed = False
        self.reset = False  # closed as a broken connection (`Store.drop_watches`)

    def preload(self, events: Iterable[StoredEvent]) -> None:
        """Queues the initial state or the replayed history (exempt from the queue limit)."""
        for event in events:
            self.offer(event, bounded=False)

    def offer(self, event: StoredEvent, *, bounded: bool = True) -> None:
        """Queues a committed event if this watcher selects it."""
        if self.closed:
            return
        if self._namespace is not None and event.namespace != self._namespace:
            return
        shaped = self._shape(event)
        if shaped is None:
            return
        if bounded and len(self._queue) >= self._limit:
            self.close()
            return
        self._queue.append(shaped)
        self._ready.set()

    def _shape(self, event: StoredEvent) -> StoredEvent | None:
        if self._labels.empty and self._fields.empty:
            return event
        now = matches(event.labels, event.fields, self._labels, self._fields)
        if event.type == "ADDED":
            return event if now else None
        if event.type == "DELETED":
            return event if now else None
        assert event.prev_labels is not None
        assert event.prev_fields is not None
        before = matches(event.prev_labels, event.prev_fields, self._labels, self._fields)
        if now and before:
            return event
        if now:
            return StoredEvent(
                "ADDED",
                event.resource,
                event.namespace,
                event.name,
                event.rv,
                event.uid,
                event.raw,
                event.labels,
                event.fields,
            )
        if before:
            # The apiserver sends the previous object content at the event's version.
            assert event.prev_raw is not None
            prev: dict[str, Any] = json.loads(event.prev_raw)
            prev["metadata"]["resourceVersion"] = str(event.rv)
            return StoredEvent(
                "DELETED",
                event.resource,
                event.namespace,
                event.name,
                event.rv,
                event.uid,
                dumps(prev),
                event.prev_labels,
                event.prev_fields,
            )
        return None

    def next_nowait(self) -> StoredEvent | None:
        if self._queue:
            return self._queue.popleft()
        return None

    async def next(self, timeout: float | None = None) -> StoredEvent | None:  # noqa: ASYNC109
        """The next event; None on timeout or once the watch has ended."""
        while not self._queue:
            if self.closed:
                return None
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        return self._queue.popleft()

    def close(self, *, reset: bool = False) -> None:
        """Ends the iteration; `reset` tells the HTTP layer to break the connection."""
        self.reset = self.reset or (reset and not self.closed)
        self.closed = True
        self._on_close(self)
        self._ready.set()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> StoredEvent:
        event = await self.next()
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
