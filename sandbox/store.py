"""The emulator's storage: versioned objects in memory, list pages, and watch fan-out.

This is the layer under the API semantics (`sandbox.registry`), playing etcd plus the
apiserver's watch cache. It is generic: it knows metadata (name, namespace, uid,
resourceVersion, creationTimestamp, ownerReferences, labels) and the field labels a
`Resource` declares, nothing about pods or jobs.

API (all methods are synchronous and atomic; call them on the event loop's thread only — the
store is not thread-safe, and needs no locks because nothing in it awaits):

    store = Store(history_limit=10_000, history_seconds=75, continue_ttl_seconds=300)
    obj = store.create(PODS, {"metadata": {"name": "p", "namespace": "ns"}, ...})
    obj = store.get(PODS, "ns", "p")                   # a fresh dict; raises ApiError 404
    page = store.list(PODS, "ns", labels=LabelSelector.parse("app=x"),
                      fields=FieldSelector.parse("spec.nodeName=n1"), limit=500,
                      continue_token=None)             # page.items(), page.raw_items,
                                                       # page.resource_version, page.continue_token
                                                       # (410 once the token's snapshot is gone)
    obj = store.update(PODS, obj, expected_rv=7)       # 409 Conflict when the rv moved on
    last = store.delete(PODS, "ns", "p")               # the final state, at the deletion's rv
    async with store.watch(PODS, "ns", since="42") as watch:   # 410 when 42 is compacted away
        async for event in watch:                      # StoredEvent: type, rv, object()
            ...
    store.add_listener(callback)                       # sync callback per committed event
    store.compact()                                    # history and list snapshots dropped: 410
    store.drop_watches(reset=True)                     # every open watch ends (connection reset)

Objects are kept as their JSON serialization, so a read returns a private copy (a controller
may mutate what it got), a list page is the join of stored bytes (no per-request
re-serialization), and one event's bytes fan out to every watcher. Lists are ordered by key
(`namespace/name`), as etcd orders them, so `continue` tokens are stable; namespace and
indexed-field (`spec.nodeName`) lookups avoid scanning the whole resource.

Resource versions are one global counter. A watch replays from a per-resource history bounded
as the apiserver's watch cache is, by count (`history_limit`) and by age (`history_seconds`,
75 s as the cache's event freshness): asking for a version older than the history holds is 410
Expired, as from a compacted etcd, so a client that re-watches from an old version after a gap
must relist. `compact()` drops all history at once (any watch from an earlier version is 410).

A paginated list is one MVCC snapshot, as etcd serves every page at the first page's revision:
the first page that leaves more behind keeps references to the remaining entries (no bytes are
copied, no sort beyond what the list needs anyway), keyed by an id its continue token carries;
later pages read from it, so objects created, changed or deleted meanwhile do not show. A
snapshot lives `continue_ttl_seconds` (300 s, etcd's compaction interval), at most
`snapshot_limit` are kept (the oldest goes first), the last page frees it, and `compact()`
drops them all; a token whose snapshot is gone is 410 Expired with the apiserver's message, and
the Status carries a token that resumes inconsistently from the live data (`rv` -1), as the
apiserver's does.

One resource's entries, indexes and watch history are a `store_table.Table`; the continue
token and the parsing of a request's resourceVersion are `continuation`'s.
"""

from __future__ import annotations

import bisect
import builtins
import datetime as dt
import json
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from sandbox import errors
from sandbox.continuation import (
    CONTINUE_EXPIRED,
    Continue,
    decode_continue,
    encode_continue,
    parse_resource_version,
)
from sandbox.resources import Resource, extract_fields
from sandbox.selectors import FieldSelector, LabelSelector
from sandbox.store_table import Entry, Table
from sandbox.watches import EventType, matches
from sandbox.watches import StoredEvent as StoredEvent
from sandbox.watches import Watch as Watch
from sandbox.watches import dumps as dumps

Listener = Callable[["StoredEvent"], None]

DEFAULT_HISTORY = 10_000
DEFAULT_HISTORY_SECONDS = 75.0  # the watch cache's eventFreshDuration
DEFAULT_CONTINUE_TTL_SECONDS = 300.0  # etcd's compaction interval on GKE
DEFAULT_SNAPSHOTS = 64
DEFAULT_WATCH_QUEUE = 100_000


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ListPage:
    """One page of a list: the stored bytes of its items and the ListMeta values."""

    raw_items: list[bytes]
    resource_version: int
    continue_token: str | None = None
    remaining: int | None = None

    def items(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.raw_items]


@dataclass(slots=True)
class _Snapshot:
    """What a paginated list has left to serve, as of its first page: keys in order and the
    entries they held then (references to the stored ones, which are never mutated)."""

    resource: Resource
    namespace: str | None
    rv: int
    created: float
    keys: list[str]
    entries: list[Entry]


class Store:
    """In-memory object storage with resourceVersions, list pages and watches (see module doc)."""

    def __init__(
        self,
        *,
        history_limit: int = DEFAULT_HISTORY,
        history_seconds: float = DEFAULT_HISTORY_SECONDS,
        continue_ttl_seconds: float = DEFAULT_CONTINUE_TTL_SECONDS,
        snapshot_limit: int = DEFAULT_SNAPSHOTS,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`now` stamps creationTimestamps; `clock` (seconds, monotonic) ages watch history
        and list snapshots."""
        self._history_limit = history_limit
        self._history_seconds = history_seconds
        self._continue_ttl = continue_ttl_seconds
        self._snapshot_limit = snapshot_limit
        self._now = now
        self._clock = clock
        self._compacted = 0  # the resourceVersion of the last compact()
        self._snapshots: OrderedDict[str, _Snapshot] = OrderedDict()
        self._rv = 1
        self._tables: dict[Resource, Table] = {}
        self._uids: dict[str, tuple[Resource, str]] = {}
        self._dependents: dict[str, set[tuple[Resource, str]]] = {}
        self._listeners: list[Listener] = []

    # -- reads -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (every write takes the next one)."""
        return self._rv

    def now(self) -> dt.datetime:
        return self._now()

    def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        """A private copy of the object; raises ApiError 404 when absent."""
        result: dict[str, Any] = json.loads(self.get_raw(resource, namespace, name))
        return result

    def get_raw(self, resource: Resource, namespace: str | None, name: str) -> bytes:
        entry = self._table(resource).entries.get(_key(resource, namespace, name))
        if entry is None:
            raise errors.not_found(resource, name)
        return entry.raw

    def exists(self, resource: Resource, namespace: str | None, name: str) -> bool:
        return _key(resource, namespace, name) in self._table(resource).entries

    def count(self, resource: Resource, namespace: str | None = None) -> int:
        table = self._table(resource)
        if namespace is None:
            return len(table.entries)
        return len(table.by_namespace.get(namespace, ()))

    def namespaces_in_use(self, resource: Resource) -> list[str]:
        return sorted(self._table(resource).by_namespace)

    def locate_uid(self, uid: str) -> tuple[Resource, str, str] | None:
        """Which object holds `uid`, as (resource, namespace, name)."""
        found = self._uids.get(uid)
        if found is None:
            return None
        resource, key = found
        ns, name = _split(resource, key)
        return resource, ns, name

    def dependents(self, owner_uid: str) -> list[tuple[Resource, str, str]]:
        """Objects whose ownerReferences name `owner_uid`, as (resource, namespace, name)."""
        out = [(r, *_split(r, key)) for r, key in self._dependents.get(owner_uid, ())]
        return sorted(out, key=lambda t: (t[0].plural, t[1], t[2]))

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        limit: int = 0,
        continue_token: str | None = None,
    ) -> ListPage:
        """A page of matching objects in key order; `limit=0` means all of them.

        A continue token reads from its list's snapshot (see module doc); raises 410 Expired
        when that is gone, 400 for a token that is not one.
        """
        table = self._table(resource)
        ns = namespace if resource.namespaced else None
        prefix = f"{ns}/" if ns is not None else ""
        token = decode_continue(continue_token) if continue_token else None
        snapshot: _Snapshot | None = None
        snapshot_id: str | None = None
        if token is not None and token.rv != -1:
            snapshot_id = token.snapshot
            snapshot = self._continued(token, resource, ns)
            keys = snapshot.keys
        else:
            keys = self._candidate_keys(table, ns, fields)
        start = token.start if token is not None else ""
        begin = bisect.bisect_left(keys, prefix + start) if start else 0
        selective = not ((labels is None or labels.empty) and (fields is None or fields.empty))
        entries = table.entries
        raw: builtins.list[bytes] = []
        last_key = ""
        stop: int | None = None
        for i in range(begin, len(keys)):
            entry = snapshot.entries[i] if snapshot is not None else entries[keys[i]]
            if selective and not matches(entry.labels, entry.fields, labels, fields):
                continue
            if limit and len(raw) == limit:
                stop = i
                break
            raw.append(entry.raw)
            last_key = keys[i]
        page = ListPage(raw, snapshot.rv if snapshot is not None else self._rv)
        if stop is None:
            if snapshot_id is not None:
                self._snapshots.pop(snapshot_id, None)  # the list is done
            return page
        if snapshot_id is None:
            snapshot_id = self._take_snapshot(table, ns, keys[stop:])
        page.continue_token = encode_continue(
            page.resource_version, last_key[len(prefix) :], snapshot_id
        )
        if not selective:
            page.remaining = len(keys) - bisect.bisect_right(keys, last_key)
        return page

    def _take_snapshot(self, table: Table, namespace: str | None, keys: builtins.list[str]) -> str:
        """Keeps what a list has left to serve (`keys` and their entries now); its id."""
        now = self._clock()
        self._expire_snapshots(now)
        while len(self._snapshots) >= self._snapshot_limit:
            self._snapshots.popitem(last=False)
        snapshot_id = secrets.token_hex(8)
        self._snapshots[snapshot_id] = _Snapshot(
            table.resource,
            namespace,
            self._rv,
            now,
            keys,
            builtins.list(map(table.entries.__getitem__, keys)),
        )
        return snapshot_id

    def _expire_snapshots(self, now: float) -> None:
        while self._snapshots:
            oldest = next(iter(self._snapshots.values()))
            if now - oldest.created <= self._continue_ttl:
                break
            self._snapshots.popitem(last=False)

    def _continued(self, token: Continue, resource: Resource, namespace: str | None) -> _Snapshot:
        self._expire_snapshots(self._clock())
        snapshot = self._snapshots.get(token.snapshot or "")
        if snapshot is None or snapshot.rv != token.rv:
            error = errors.expired(CONTINUE_EXPIRED)
            error.metadata = {"continue": encode_continue(-1, token.start.removesuffix("\x00"))}
            raise error
        if (snapshot.resource, snapshot.namespace) != (resource, namespace):
            raise errors.bad_request("continue key is not valid: it belongs to another list")
        return snapshot

    def _candidate_keys(
        self, table: Table, namespace: str | None, fields: FieldSelector | None
    ) -> builtins.list[str]:
        if fields is not None:
            for name in table.resource.indexed_fields:
                value = fields.equality(name)
                if value is not None:
                    keys = table.index.get(name, {}).get(value, set())
                    if namespace is not None:
                        prefix = f"{namespace}/"
                        return sorted(k for k in keys if k.startswith(prefix))
                    return sorted(keys)
        return table.sorted_keys(namespace)

    # -- writes ------------------------------------------------------------------------------

    def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Stores a new object, assigning uid, creationTimestamp and resourceVersion.

        The object must already name itself (`metadata.name`, and `metadata.namespace` for a
        namespaced resource); raises ApiError 409 AlreadyExists when the key is taken.
        """
        table = self._table(resource)
        meta = dict(obj.get("metadata") or {})
        ns = str(meta.get("namespace", "")) if resource.namespaced else ""
        name = str(meta.get("name", ""))
        key = _key(resource, ns, name)
        if key in table.entries:
            raise errors.already_exists(resource, name)
        self._rv += 1
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["resourceVersion"] = str(self._rv)
        meta["creationTimestamp"] = meta.get("creationTimestamp") or rfc3339(self._now())
        stored = {**obj, "metadata": meta}
        entry = self._entry(resource, stored, meta)
        table.add_key(key, ns, entry)
        self._uids[entry.uid] = (resource, key)
        self._link_owners(resource, key, (), entry.owners)
        self._commit(table, self._event("ADDED", resource, key, entry, None))
        return stored

    def update(
        self, resource: Resource, obj: dict[str, Any], *, expected_rv: int | None = None
    ) -> dict[str, Any]:
        """Replaces an object; uid and creationTimestamp are kept from the stored one.

        Raises 404 when absent and 409 Conflict when `expected_rv` is not the stored version.
        """
        table = self._table(resource)
        meta = dict(obj.get("metadata") or {})
        ns = str(meta.get("namespace", "")) if resource.namespaced else ""
        name = str(meta.get("name", ""))
        key = _key(resource, ns, name)
        old = table.entries.get(key)
        if old is None:
            raise errors.not_found(resource, name)
        if expected_rv is not None and expected_rv != old.rv:
            raise errors.conflict(resource, name)
        self._rv += 1
        meta["uid"] = old.uid
        meta["creationTimestamp"] = old.created
        meta["resourceVersion"] = str(self._rv)
        stored = {**obj, "metadata": meta}
        entry = self._entry(resource, stored, meta)
        table.entries[key] = entry
        table.reindex(key, old.fields, entry.fields)
        self._link_owners(resource, key, old.owners, entry.owners)
        self._commit(table, self._event("MODIFIED", resource, key, entry, old))
        return stored

    def delete(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        """Removes an object; returns its final state stamped with the deletion's version."""
        table = self._table(resource)
        ns = (namespace or "") if resource.namespaced else ""
        key = _key(resource, ns, name)
        if key not in table.entries:
            raise errors.not_found(resource, name)
        old = table.remove_key(key, ns)
        self._uids.pop(old.uid, None)
        self._link_owners(resource, key, old.owners, ())
        self._rv += 1
        final: dict[str, Any] = json.loads(old.raw)
        final["metadata"]["resourceVersion"] = str(self._rv)
        shown = replace(old, raw=dumps(final))
        self._commit(table, self._event("DELETED", resource, key, shown, old))
        return final

    # -- a saved cluster (`sandbox.persist`) -------------------------------------------------

    def objects(self) -> Iterator[tuple[Resource, bytes]]:
        """Every stored object, as its resource and stored bytes (what a snapshot keeps)."""
        for resource, table in self._tables.items():
            for entry in table.entries.values():
                yield resource, entry.raw

    def restore(self, objects: Iterable[tuple[Resource, dict[str, Any]]], rv: int) -> None:
        """Loads saved objects into an empty store as they were (uid, resourceVersion,
        creationTimestamp kept; no event, no history), the counter at `rv` or past the newest
        of them. Then compacts, as an apiserver starting over etcd has no watch cache: a watch
        from an older version is 410 and relists."""
        for resource, obj in objects:
            meta = obj["metadata"]
            ns = str(meta.get("namespace", "")) if resource.namespaced else ""
            key = _key(resource, ns, str(meta["name"]))
            table = self._table(resource)
            if key in table.entries:
                raise ValueError(f"{resource.qualified} {key} is saved twice")
            entry = self._entry(resource, obj, meta)
            entry.rv = int(meta["resourceVersion"])
            table.add_key(key, ns, entry)
            self._uids[entry.uid] = (resource, key)
            self._link_owners(resource, key, (), entry.owners)
            self._rv = max(self._rv, entry.rv)
        self._rv = max(self._rv, rv)
        self.compact()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Calls `listener` synchronously after every committed write (after watchers saw it).

        A listener may write to the store itself (the garbage collector does); its writes are
        committed and fanned out before the outer write returns. Returns an unsubscribe.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # -- watch -------------------------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        since: str | None = None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        queue_limit: int = DEFAULT_WATCH_QUEUE,
    ) -> Watch:
        """Subscribes to changes.

        `since` is a resourceVersion: None, "" or "0" start with synthetic ADDED events for
        what exists now (the apiserver's "get state and start at most recent"); a number
        replays history after it, raising ApiError 410 when that history is gone.
        """
        table = self._table(resource)
        ns = namespace if resource.namespaced else None
        watch = Watch(
            resource,
            ns,
            labels or LabelSelector(),
            fields or FieldSelector(),
            queue_limit,
            table.watchers.discard,
        )
        if since in (None, "", "0"):
            watch.preload(self._snapshot_events(table, ns))
        else:
            start = parse_resource_version(str(since))
            table.trim(self._clock())
            if start < table.floor:
                raise errors.gone_too_old(start, table.floor + 1)
            watch.preload(e for e in table.history if e.rv > start)
        table.watchers.add(watch)
        return watch

    def compact(self) -> None:
        """Drops every watch history and list snapshot, as an etcd compaction at the current
        revision: a watch from any earlier version and every continue token are 410 Expired."""
        self._compacted = self._rv
        for table in self._tables.values():
            table.compact(self._rv)
        self._snapshots.clear()

    def drop_watches(self, *, reset: bool = False) -> int:
        """Ends every open watch, as an apiserver restart does; `reset` asks the HTTP layer to
        break the connection rather than end the stream. Returns how many were open."""
        dropped = 0
        for table in self._tables.values():
            for watch in builtins.list(table.watchers):
                watch.close(reset=reset)
                dropped += 1
        return dropped

    def _snapshot_events(self, table: Table, namespace: str | None) -> Iterator[StoredEvent]:
        resource = table.resource
        for key in table.sorted_keys(namespace):
            entry = table.entries[key]
            ns, name = _split(resource, key)
            yield StoredEvent(
                "ADDED",
                resource,
                ns,
                name,
                entry.rv,
                entry.uid,
                entry.raw,
                entry.labels,
                entry.fields,
            )

    # -- internals ---------------------------------------------------------------------------

    def _table(self, resource: Resource) -> Table:
        table = self._tables.get(resource)
        if table is None:
            table = self._tables[resource] = Table(
                resource, self._history_limit, self._history_seconds, floor=self._compacted
            )
        return table

    def _event(
        self, type_: EventType, resource: Resource, key: str, entry: Entry, before: Entry | None
    ) -> StoredEvent:
        """The event of a change to the object at `key` committed at this version: `entry` as
        the event shows it, `before` as it was."""
        ns, name = _split(resource, key)
        return StoredEvent(
            type_,
            resource,
            ns,
            name,
            self._rv,
            entry.uid,
            entry.raw,
            entry.labels,
            entry.fields,
            None if before is None else before.raw,
            None if before is None else before.labels,
            None if before is None else before.fields,
            entry.owners,
        )

    def _entry(self, resource: Resource, obj: dict[str, Any], meta: dict[str, Any]) -> Entry:
        owners = tuple(str(ref.get("uid")) for ref in meta.get("ownerReferences") or ())
        return Entry(
            raw=dumps(obj),
            rv=self._rv,
            uid=str(meta["uid"]),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            fields=extract_fields(resource, obj),
            owners=owners,
            created=str(meta.get("creationTimestamp") or ""),
        )

    def _link_owners(
        self, resource: Resource, key: str, old: Iterable[str], new: Iterable[str]
    ) -> None:
        old_set, new_set = set(old), set(new)
        for uid in old_set - new_set:
            members = self._dependents.get(uid)
            if members is not None:
                members.discard((resource, key))
                if not members:
                    del self._dependents[uid]
        for uid in new_set - old_set:
            self._dependents.setdefault(uid, set()).add((resource, key))

    def _commit(self, table: Table, event: StoredEvent) -> None:
        table.record(event, self._clock())
        for watch in list(table.watchers):
            watch.offer(event)
        for listener in list(self._listeners):
            listener(event)


def _key(resource: Resource, namespace: str | None, name: str) -> str:
    return f"{namespace or ''}/{name}" if resource.namespaced else name


def _split(resource: Resource, key: str) -> tuple[str, str]:
    if not resource.namespaced:
        return "", key
    ns, _, name = key.partition("/")
    return ns, name
