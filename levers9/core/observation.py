"""What changed since the previous reconcile pass, kept small enough for Temporal history (pure).

A pass keeps, per node, 4 bytes of a hash of its name and 4 bytes of a hash of its capacity
record: at 5,000 nodes 40 KB, 53 KB as base64, stored once (the observe activity's result),
which is what lets an idle pass stay under 64 KiB of history. A node is told when its entry is
new or its state hash moved; a name hash that vanished is a node gone, whose name the caller
finds among the machine records (running MachineWorkflows) by the same hash.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from levers9.core.capacity import NodeCapacity

_HASH_BYTES = 4
_ENTRY = 2 * _HASH_BYTES


class Fingerprints(BaseModel):
    """The pool as a pass saw it: base64 of (name hash, state hash) pairs."""

    model_config = ConfigDict(frozen=True)

    entries: str

    def table(self) -> dict[bytes, bytes]:
        raw = base64.b64decode(self.entries)
        return {
            raw[i : i + _HASH_BYTES]: raw[i + _HASH_BYTES : i + _ENTRY]
            for i in range(0, len(raw), _ENTRY)
        }


def name_hash(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=_HASH_BYTES).digest()


def _state_hash(node: NodeCapacity) -> bytes:
    return hashlib.blake2b(node.model_dump_json().encode(), digest_size=_HASH_BYTES).digest()


def fingerprints(nodes: Mapping[str, NodeCapacity]) -> Fingerprints:
    raw = b"".join(name_hash(name) + _state_hash(node) for name, node in sorted(nodes.items()))
    return Fingerprints(entries=base64.b64encode(raw).decode())


@dataclass(frozen=True)
class Diff:
    """Nodes to tell (new or changed). Vanished nodes are found against the running machine
    records instead (activities/reconcile.py), which a pass without fingerprints has too."""

    changed: list[str]


def vanished(previous: Fingerprints, nodes: Mapping[str, NodeCapacity]) -> bool:
    """Whether a node of the previous pass is not among `nodes` (a name hash missing)."""
    now = {name_hash(name) for name in nodes}
    return any(entry not in now for entry in previous.table())


def diff(previous: Fingerprints | None, nodes: Mapping[str, NodeCapacity]) -> Diff:
    """What the pass must tell; every node when there is no previous pass."""
    if previous is None:
        return Diff(changed=sorted(nodes))
    old = previous.table()
    changed = [
        name for name in sorted(nodes) if old.get(name_hash(name)) != _state_hash(nodes[name])
    ]
    return Diff(changed=changed)
