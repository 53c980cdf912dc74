"""One resource's share of the store (`sandbox.store`): its entries (`Entry`: the object's JSON
bytes and the metadata the store indexes), the namespace and field indexes, the sorted keys kept
for lists, and the watch history with its watchers, trimmed by count and by age."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from sandbox.resources import Resource
from sandbox.watches import StoredEvent, Watch


@dataclass(slots=True)
class Entry:
    """One stored object: its JSON bytes and what the store indexes of it."""

    raw: bytes
    rv: int
    uid: str
    labels: dict[str, str]
    fields: dict[str, str]
    owners: tuple[str, ...]
    created: str


@dataclass
class Table:
    """Everything stored for one resource."""

    resource: Resource
    history_limit: int
    history_seconds: float
    entries: dict[str, Entry] = field(default_factory=dict)
    by_namespace: dict[str, set[str]] = field(default_factory=dict)
    index: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    # Sorted key lists are built on the first list call and then kept up to date, so bulk
    # loading pays nothing and steady-state lists pay no sort.
    sorted_all: list[str] | None = None
    sorted_ns: dict[str, list[str]] = field(default_factory=dict)
    history: deque[StoredEvent] = field(default_factory=deque)
    recorded: deque[float] = field(default_factory=deque)  # when each history event was
    floor: int = 0  # the newest resourceVersion no longer in `history`
    watchers: set[Watch] = field(default_factory=set)

    def add_key(self, key: str, ns: str, entry: Entry) -> None:
        self.entries[key] = entry
        self.by_namespace.setdefault(ns, set()).add(key)
        if self.sorted_all is not None:
            bisect.insort(self.sorted_all, key)
        ns_keys = self.sorted_ns.get(ns)
        if ns_keys is not None:
            bisect.insort(ns_keys, key)
        self._index(key, entry.fields, add=True)

    def remove_key(self, key: str, ns: str) -> Entry:
        entry = self.entries.pop(key)
        members = self.by_namespace.get(ns)
        if members is not None:
            members.discard(key)
            if not members:
                del self.by_namespace[ns]
        for keys in (self.sorted_all, self.sorted_ns.get(ns)):
            if keys is not None:
                i = bisect.bisect_left(keys, key)
                if i < len(keys) and keys[i] == key:
                    del keys[i]
        if ns not in self.by_namespace:
            self.sorted_ns.pop(ns, None)
        self._index(key, entry.fields, add=False)
        return entry

    def reindex(self, key: str, old: dict[str, str], new: dict[str, str]) -> None:
        if any(old.get(f) != new.get(f) for f in self.resource.indexed_fields):
            self._index(key, old, add=False)
            self._index(key, new, add=True)

    def _index(self, key: str, fields: dict[str, str], *, add: bool) -> None:
        for name in self.resource.indexed_fields:
            values = self.index.setdefault(name, {})
            value = fields.get(name, "")
            if add:
                values.setdefault(value, set()).add(key)
            else:
                keys = values.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del values[value]

    def sorted_keys(self, namespace: str | None) -> list[str]:
        if namespace is None:
            if self.sorted_all is None:
                self.sorted_all = sorted(self.entries)
            return self.sorted_all
        keys = self.sorted_ns.get(namespace)
        if keys is None:
            keys = sorted(self.by_namespace.get(namespace, ()))
            if keys:
                self.sorted_ns[namespace] = keys
        return keys

    def record(self, event: StoredEvent, now: float) -> None:
        self.history.append(event)
        self.recorded.append(now)
        self.trim(now)

    def trim(self, now: float) -> None:
        """Drops the events beyond the count limit and those older than the age limit."""
        history, recorded = self.history, self.recorded
        oldest = now - self.history_seconds
        while history and (len(history) > self.history_limit or recorded[0] < oldest):
            self.floor = history.popleft().rv
            recorded.popleft()

    def compact(self, rv: int) -> None:
        self.history.clear()
        self.recorded.clear()
        self.floor = rv
