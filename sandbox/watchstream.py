"""Watch over HTTP: newline-delimited JSON events in a chunked 200 response.

Honours `resourceVersion` (replay, or 410 Expired delivered as an ERROR event in the stream,
as the apiserver's watch cache does), `timeoutSeconds` (the server ends the stream),
`allowWatchBookmarks` (BOOKMARK events while idle and just before the timeout ends it) and
`sendInitialEvents` (the current state first, closed by a bookmark annotated
`k8s.io/initial-events-end`). With `Accept: ...as=Table` each event carries a one-row Table,
which is what `kubectl get -w` prints. A watch ended by `Store.drop_watches(reset=True)` breaks
its connection mid-stream (the client reads a truncated chunked body); one ended without
`reset` ends its stream cleanly, as an apiserver shutting down does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sandbox import errors, tables
from sandbox.registry import Registry
from sandbox.resources import Resource
from sandbox.selectors import FieldRequirement, FieldSelector, LabelSelector
from sandbox.store import StoredEvent, Watch, dumps

DEFAULT_WATCH_TIMEOUT = 1800.0  # the apiserver's --min-request-timeout
_BATCH = 500


@dataclass(frozen=True)
class WatchRequest:
    resource: Resource
    namespace: str | None
    name: str | None
    query: dict[str, str]
    as_table: bool


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


class WatchStreamer:
    """Serves watch requests against a registry."""

    def __init__(self, registry: Registry, *, bookmark_interval: float = 60.0) -> None:
        self._registry = registry
        self._bookmark_interval = bookmark_interval

    async def serve(self, request: web.Request, spec: WatchRequest) -> web.StreamResponse:
        query = spec.query
        fields = FieldSelector.parse(query.get("fieldSelector"))
        if spec.name is not None:
            fields = FieldSelector(
                (*fields.requirements, FieldRequirement("metadata.name", spec.name, True))
            )
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields.check_supported(spec.resource.all_field_labels())
        timeout = _timeout(query.get("timeoutSeconds"))
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        initial = _truthy(query.get("sendInitialEvents"))
        since = None if initial else query.get("resourceVersion")
        expired: errors.ApiError | None = None
        watch: Watch | None = None
        try:
            watch = self._registry.watch(
                spec.resource,
                spec.namespace,
                since=since,
                label_selector=labels,
                field_selector=fields,
            )
        except errors.ApiError as error:
            if error.code != 410:
                raise
            expired = error
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": tables.TABLE_MEDIA_TYPE if spec.as_table else "application/json",
                "Cache-Control": "no-cache, private",
            },
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        if expired is not None or watch is None:
            body = dumps({"type": "ERROR", "object": expired.status() if expired else {}})
            await response.write(body + b"\n")
            await response.write_eof()
            return response
        try:
            await self._pump(response, watch, spec, timeout, bookmarks, initial)
        finally:
            watch.close()
        if watch.reset:  # its connection broken, or already gone (`Sandbox.crash`)
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        await response.write_eof()
        return response

    async def _pump(
        self,
        response: web.StreamResponse,
        watch: Watch,
        spec: WatchRequest,
        seconds: float,
        bookmarks: bool,
        initial: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        next_bookmark = loop.time() + self._bookmark_interval
        encode = self._encoder(spec)
        if initial:
            lines = [encode(e) for e in _drain(watch, None)]
            lines.append(self._bookmark(spec.resource, initial_end=True))
            await response.write(b"".join(lines))
        while True:
            now = loop.time()
            if now >= deadline:
                if bookmarks:
                    await response.write(self._bookmark(spec.resource))
                return
            wait = deadline - now
            if bookmarks:
                wait = min(wait, max(next_bookmark - now, 0.0))
            event = await watch.next(timeout=wait)
            if event is None:
                if watch.closed:
                    return
                if bookmarks and loop.time() >= next_bookmark:
                    await response.write(self._bookmark(spec.resource))
                    next_bookmark = loop.time() + self._bookmark_interval
                continue
            await response.write(b"".join(encode(e) for e in _drain(watch, event)))
            next_bookmark = loop.time() + self._bookmark_interval

    def _encoder(self, spec: WatchRequest) -> Callable[[StoredEvent], bytes]:
        if not spec.as_table:

            def encode_raw(event: StoredEvent) -> bytes:
                return b'{"type":"' + event.type.encode() + b'","object":' + event.raw + b"}\n"

            return encode_raw
        headers = [True]

        def encode_table(event: StoredEvent) -> bytes:
            obj: dict[str, Any] = json.loads(event.raw)
            include = spec.query.get("includeObject", "Metadata")
            row = tables.table(
                spec.resource,
                [obj],
                now=self._registry.store.now(),
                include_object=include,
                list_meta={"resourceVersion": str(event.rv)},
                headers=headers[0],
            )
            headers[0] = False
            return dumps({"type": event.type, "object": row}) + b"\n"

        return encode_table

    def _bookmark(self, resource: Resource, *, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {
            "resourceVersion": str(self._registry.store.resource_version),
            "creationTimestamp": None,
        }
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": meta}
        return dumps({"type": "BOOKMARK", "object": obj}) + b"\n"


def _drain(watch: Watch, first: StoredEvent | None) -> list[StoredEvent]:
    """The event just received plus whatever else is queued, up to a batch."""
    batch = [] if first is None else [first]
    limit = _BATCH if first is not None else 1 << 62
    while len(batch) < limit:
        event = watch.next_nowait()
        if event is None:
            break
        batch.append(event)
    return batch


def _timeout(value: str | None) -> float:
    if value is None:
        return DEFAULT_WATCH_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise errors.bad_request(f"invalid timeoutSeconds: {value}") from None
    return seconds if seconds > 0 else DEFAULT_WATCH_TIMEOUT
