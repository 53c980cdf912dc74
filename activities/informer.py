"""One resource kept current by list and watch: client-go's reflector, in a thread.

    reflector = Reflector("pods", core.list_pod_for_all_namespaces, {"field_selector": ...},
                          convert=pod_hold, sink=cache, stop=stop_event)
    threading.Thread(target=reflector.run, daemon=True).start()

It lists (pages of raw JSON, every page from the first page's snapshot), hands the whole set to
the sink, then watches from the list's resourceVersion with `allowWatchBookmarks`, so an idle
watch still moves its resourceVersion forward and a reconnect does not replay (or miss)
anything. A stream the server ends (`timeoutSeconds`, 5 to 10 minutes, randomised as client-go
does so that replicas do not reconnect together) is re-watched from the last resourceVersion
at once; a broken one (connection reset, a garbled line, a 5xx) after a backoff doubling from
0.8 s to 30 s; a 410 Gone (the resourceVersion is older than the apiserver's watch window, or
a list's continue token expired) relists. The sink is told it is not synced from a failure
until a watch connects again, and during a relist.

The sink gets objects already converted (`convert` keeps what a pass reads and drops the rest,
`managedFields` first), keyed `namespace/name`.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.watch.watch import iter_resp_lines

from levers9.logs import get_logger

T = TypeVar("T")
PAGE = 500
WATCH_TIMEOUT_S = (300, 600)
"""The server ends each watch within this many seconds (client-go: 5 minutes, times 1 to 2)."""
READ_SLACK_S = 30.0
"""A watch stream silent this long past its own timeout is dead (a dropped connection)."""
BACKOFF_S = (0.8, 30.0)

log = get_logger("levers9.informer")


class Gone(Exception):
    """410: what we hold is older than the server can continue from; list again."""


class Sink(Protocol[T]):
    """Where a reflector's objects go (the pool cache); called from the reflector's thread."""

    def replace(self, kind: str, items: dict[str, T]) -> None: ...

    def upsert(self, kind: str, key: str, item: T | None) -> None: ...

    def delete(self, kind: str, key: str) -> None: ...

    def unsynced(self, kind: str) -> None: ...

    def resumed(self, kind: str) -> None:
        """A watch connected again from the version of what the sink holds."""


def object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace') or ''}/{metadata.get('name')}"


class Reflector(Generic[T]):
    """Lists and watches one resource into a sink until `stop` is set (see module doc)."""

    def __init__(
        self,
        kind: str,
        call: Callable[..., Any],
        selectors: Mapping[str, Any],
        *,
        convert: Callable[[dict[str, Any]], T | None],
        sink: Sink[T],
        stop: threading.Event,
        labels: Mapping[str, str] | None = None,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self.kind = kind
        self._call = call
        self._selectors = dict(selectors)
        self._convert = convert
        self._sink = sink
        self._stop = stop
        self._labels = dict(labels or {})
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._response: Any = None
        self._wake = threading.Event()
        self.resource_version: str | None = None
        self.lists = 0
        """List passes made (each one or more pages): 1 at start, one more per relist."""
        self.watches = 0
        self.failures = 0
        """Lists and watches that failed (refused, dropped, broken), each followed by a backoff."""

    def run(self) -> None:
        delay = self._backoff_s[0]
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._sink.unsynced(self.kind)
                    items, version = self._list()
                    self._sink.replace(self.kind, items)
                    self.resource_version = version
                self._watch()
                delay = self._backoff_s[0]
            except Gone:
                log.info("watch expired: relisting", kind=self.kind, **self._labels)
                self.resource_version = None
            except (k8s.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    return
                # Until a watch connects again, a pass lists: it says why it cannot, where
                # this cache would go on answering from what it held.
                self._sink.unsynced(self.kind)
                self.failures += 1
                log.warning(
                    "watch broken: retrying",
                    kind=self.kind,
                    error=_describe(exc),
                    retry_in_s=round(delay, 1),
                    **self._labels,
                )
                self._wake.wait(delay * random.uniform(1.0, 1.2))  # jitter
                self._wake.clear()
                delay = min(delay * 2, self._backoff_s[1])

    def kick(self) -> None:
        """Ends a backoff now: the cluster answered someone else (a pass's list)."""
        self._wake.set()

    def close(self) -> None:
        """Ends the current stream and any backoff at once (after `stop` is set, so `run`
        returns)."""
        self._wake.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(AttributeError, OSError):
                response.shutdown()

    def _list(self) -> tuple[dict[str, T], str]:
        items: dict[str, T] = {}
        token: str | None = None
        version = ""
        while True:
            try:
                response = self._call(
                    limit=PAGE, _continue=token, _preload_content=False, **self._selectors
                )
            except k8s.ApiException as exc:
                if exc.status == 410:
                    raise Gone() from None  # the continue token expired: list afresh
                raise
            page = json.loads(response.data)
            for obj in page.get("items") or ():
                converted = self._convert(obj)
                if converted is not None:
                    items[object_key(obj)] = converted
            metadata = page.get("metadata") or {}
            version = metadata.get("resourceVersion") or version
            token = metadata.get("continue")
            if not token:
                self.lists += 1
                return items, version

    def _watch(self) -> None:
        timeout = random.randint(*self._watch_timeout_s)  # spread, not secrecy
        try:
            response = self._call(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(5.0, timeout + READ_SLACK_S),
                **self._selectors,
            )
        except k8s.ApiException as exc:
            if exc.status == 410:
                raise Gone() from None
            raise
        self._response = response
        self.watches += 1
        self._sink.resumed(self.kind)
        try:
            for event in _events(response):
                if self._stop.is_set():
                    return
                self._apply(event)
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "DELETED":
            self._sink.delete(self.kind, object_key(obj))
        elif kind in ("ADDED", "MODIFIED"):
            self._sink.upsert(self.kind, object_key(obj), self._convert(obj))
        elif kind != "BOOKMARK":
            raise ValueError(f"watch event of unknown type {kind!r}")
        if version:
            self.resource_version = version


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
        if line:
            event: dict[str, Any] = json.loads(line)
            yield event


def _describe(exc: Exception) -> str:
    if isinstance(exc, k8s.ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:200]
