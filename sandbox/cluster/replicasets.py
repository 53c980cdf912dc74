"""The ReplicaSet controller (apps/v1): keeps `spec.replicas` active pods.

Pods are made from the template as `<replicaset>-<5 random>` with a controller reference.
Failed and terminating pods do not count (a pod rejected by its kubelet is replaced). On
scale-down the surplus goes in the order kube-controller-manager picks: unscheduled before
scheduled, pending before running, not ready before ready, then the newest first.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sandbox.cluster.controller import Controller, Watched
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.objects import (
    Obj,
    condition,
    is_active,
    meta,
    name_of,
    node_name_of,
    owner_reference,
    phase_of,
    pod_ready,
    uid_of,
)
from sandbox.cluster.owned import create_pod, delete_pod, owned, owners_named
from sandbox.resources import PODS, REPLICA_SETS
from sandbox.store import StoredEvent

if TYPE_CHECKING:
    from sandbox.registry import Registry

Key = tuple[str, str]


def available_since(pod: Obj, min_ready_s: int, now: dt.datetime) -> float | None:
    """Seconds until a ready pod counts as available (0 when it does), None if not ready."""
    if not pod_ready(pod):
        return None
    if min_ready_s <= 0:
        return 0.0
    since = (condition(pod, "Ready") or {}).get("lastTransitionTime")
    if not since:
        return 0.0
    return max(min_ready_s - (now.timestamp() - _epoch(str(since))), 0.0)


def _epoch(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def _deletion_rank(pod: Obj, sequence: int) -> tuple[int, int, int, float, int]:
    return (
        1 if node_name_of(pod) else 0,
        {"Pending": 0, "Unknown": 1, "Running": 2}.get(phase_of(pod), 0),
        1 if pod_ready(pod) else 0,
        -_epoch(meta(pod).get("creationTimestamp")),  # newest first
        -sequence,  # timestamps have whole seconds: creation order breaks their ties
    )


class ReplicaSetController(Controller[Key]):
    name = "replicaset-controller"

    def __init__(self, registry: Registry, resync_s: float) -> None:
        super().__init__(registry, resync_s)
        self._events = EventRecorder(registry, "replicaset-controller")
        self._sequence: dict[str, int] = {}  # pod uid -> order of creation by this controller
        self._next = 0

    def watched(self) -> list[Watched]:
        return [Watched(REPLICA_SETS, self._on_replica_set), Watched(PODS, self._on_pod)]

    def resync_keys(self) -> Iterable[Key]:
        for rs in self.registry.list(REPLICA_SETS).items():
            yield (rs["metadata"]["namespace"], name_of(rs))

    def _on_replica_set(self, event: StoredEvent) -> None:
        self.queue.add((event.namespace, event.name))

    def _on_pod(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            self._sequence.pop(event.uid, None)
        for name in owners_named(event.object(), "ReplicaSet"):
            self.queue.add((event.namespace, name))

    def reconcile(self, key: Key) -> float | None:
        namespace, name = key
        rs = self.registry.find(REPLICA_SETS, namespace, name)
        if rs is None or meta(rs).get("deletionTimestamp"):
            return None
        active = [p for p in owned(self.registry, PODS, rs) if is_active(p)]
        wanted = int((rs.get("spec") or {}).get("replicas", 1))
        if len(active) < wanted:
            active += [self._create_pod(rs) for _ in range(wanted - len(active))]
        elif len(active) > wanted:
            ranked = sorted(
                active, key=lambda p: _deletion_rank(p, self._sequence.get(uid_of(p), 0))
            )
            for pod in ranked[: len(active) - wanted]:
                delete_pod(self.registry, self._events, rs, pod)
            active = ranked[len(active) - wanted :]
        return self._write_status(rs, active)

    def _create_pod(self, rs: Obj) -> Obj:
        template = copy.deepcopy((rs.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        pod: dict[str, Any] = {
            "metadata": {
                "generateName": f"{name_of(rs)}-",
                "labels": tmeta.get("labels") or {},
                "ownerReferences": [owner_reference(REPLICA_SETS, rs)],
            },
            "spec": template.get("spec") or {},
        }
        if tmeta.get("annotations"):
            pod["metadata"]["annotations"] = tmeta["annotations"]
        created = create_pod(self.registry, self._events, rs, pod)
        self._next += 1
        self._sequence[uid_of(created)] = self._next
        return created

    def _write_status(self, rs: Obj, active: list[Obj]) -> float | None:
        spec = rs.get("spec") or {}
        min_ready = int(spec.get("minReadySeconds", 0))
        now = self.registry.store.now()
        waits = [available_since(p, min_ready, now) for p in active]
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(
                1
                for p in active
                if all(
                    (meta(p).get("labels") or {}).get(k) == v for k, v in template_labels.items()
                )
            ),
            "readyReplicas": sum(1 for p in active if pod_ready(p)),
            "availableReplicas": sum(1 for w in waits if w == 0),
            "observedGeneration": meta(rs).get("generation", 1),
        }
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        if status != rs.get("status"):
            rs["status"] = status
            self.registry.replace(REPLICA_SETS, rs, subresource="status")
        pending = [w for w in waits if w]
        return min(pending) if pending else None
