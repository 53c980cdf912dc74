"""The scheduler: binds each unscheduled pod to a node that passes the filters.

It keeps kube-scheduler's cache: nodes, and per node what the pods bound there hold (pods not
Succeeded/Failed, terminating ones included), updated from watches and, right after a bind,
"assumed" before the watch reports it, so two pods in a row never take the same card. A pod no
node can take keeps `PodScheduled=False reason=Unschedulable` with the scheduler's message and
a `FailedScheduling` event, and is retried whenever a node changes in a way that matters or a
pod frees resources, and at every resync.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.cluster.controller import Controller, Watched
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.objects import (
    Obj,
    is_terminal,
    is_terminating,
    name_of,
    node_name_of,
    set_condition,
)
from sandbox.cluster.predicates import (
    Failure,
    filter_node,
    fit_error,
    least_allocated_score,
)
from sandbox.cluster.requests import PODS as PODS_RESOURCE
from sandbox.cluster.requests import Amounts, add, allocatable, pod_requests
from sandbox.resources import NODES, PODS
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

SCHEDULER_NAME = "default-scheduler"
PodKey = tuple[str, str]


class _Bound:
    """What one bound pod holds on its node."""

    __slots__ = ("node", "request")

    def __init__(self, node: str, request: Amounts) -> None:
        self.node = node
        self.request = request


class Scheduler(Controller[PodKey]):
    name = "scheduler"

    def __init__(self, registry: Registry, resync_s: float) -> None:
        super().__init__(registry, resync_s)
        self._events = EventRecorder(registry, SCHEDULER_NAME)
        self._nodes: dict[str, Obj] = {}
        self._fingerprints: dict[str, str] = {}
        self._bound: dict[PodKey, _Bound] = {}
        self._usage: dict[str, Amounts] = {}
        self._unschedulable: set[PodKey] = set()

    def watched(self) -> list[Watched]:
        return [Watched(NODES, self._on_node), Watched(PODS, self._on_pod)]

    def resync_keys(self) -> Iterable[PodKey]:
        for pod in self.registry.list(PODS, field_selector="spec.nodeName=").items():
            if _wants_scheduling(pod):
                yield (pod["metadata"]["namespace"], name_of(pod))

    # -- the cache ---------------------------------------------------------------------------

    def _on_node(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            self._nodes.pop(event.name, None)
            self._fingerprints.pop(event.name, None)
            return
        node = event.object()
        self._nodes[event.name] = node
        # Heartbeats rewrite the node every few seconds; only a change a filter reads makes
        # the Pending pods worth another try.
        fingerprint = _fingerprint(node)
        if self._fingerprints.get(event.name) != fingerprint:
            self._fingerprints[event.name] = fingerprint
            self._retry_unschedulable()

    def _on_pod(self, event: StoredEvent) -> None:
        key = (event.namespace, event.name)
        if event.type == "DELETED":
            freed = self._forget(key)
            self._unschedulable.discard(key)
            if freed:
                self._retry_unschedulable()
            return
        pod = event.object()
        node = node_name_of(pod)
        if not node:
            if _wants_scheduling(pod) and not self._status_only(key, event, pod):
                self.queue.add(key)
            return
        self._unschedulable.discard(key)
        if is_terminal(pod):
            if self._forget(key):
                self._retry_unschedulable()
            return
        self._assume(key, node, pod)

    def _status_only(self, key: PodKey, event: StoredEvent, pod: Obj) -> bool:
        """An unschedulable pod whose spec and labels did not change (its status did, by
        this scheduler's own condition) waits for a node or a pod to change instead."""
        if key not in self._unschedulable or event.prev_raw is None:
            return False
        before = json.loads(event.prev_raw)
        return before.get("spec") == pod.get("spec") and event.prev_labels == event.labels

    def _assume(self, key: PodKey, node: str, pod: Obj) -> None:
        current = self._bound.get(key)
        if current is not None and current.node == node:
            return
        self._forget(key)
        request = pod_requests(pod)
        request[PODS_RESOURCE] = Fraction(1)
        self._bound[key] = _Bound(node, request)
        add(self._usage.setdefault(node, {}), request)

    def _forget(self, key: PodKey) -> bool:
        bound = self._bound.pop(key, None)
        if bound is None:
            return False
        add(self._usage.setdefault(bound.node, {}), bound.request, sign=-1)
        return True

    def _retry_unschedulable(self) -> None:
        for key in sorted(self._unschedulable):
            self.queue.add(key)
        self._unschedulable.clear()

    # -- scheduling one pod ------------------------------------------------------------------

    def reconcile(self, key: PodKey) -> float | None:
        namespace, name = key
        pod = self.registry.find(PODS, namespace, name)
        if pod is None or not _wants_scheduling(pod):
            return None
        request = pod_requests(pod)
        request[PODS_RESOURCE] = Fraction(1)
        feasible: list[tuple[Fraction, str]] = []
        failures: list[Failure] = []
        for node_name in sorted(self._nodes):
            node = self._nodes[node_name]
            capacity = allocatable(node)
            free = dict(capacity)
            add(free, self._usage.get(node_name, {}), sign=-1)
            failure = filter_node(pod, request, node, free)
            if failure is None:
                feasible.append((least_allocated_score(request, free, capacity), node_name))
            else:
                failures.append(failure)
        if not feasible:
            self._unschedulable.add(key)
            self._mark_unschedulable(pod, fit_error(pod, failures))
            return None
        # Highest score wins; among equals the first by name, so placement is reproducible.
        best = min(feasible, key=lambda item: (-item[0], item[1]))[1]
        try:
            bound = self.registry.bind(namespace, name, best)
        except errors.ApiError as error:
            if error.code in (404, 409):  # gone, or bound by someone else meanwhile
                return None
            raise
        self._assume(key, best, bound)
        self._events.normal(
            bound, "Scheduled", f"Successfully assigned {namespace}/{name} to {best}"
        )
        return None

    def _mark_unschedulable(self, pod: Obj, message: str) -> None:
        status = pod.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        now = rfc3339(self.registry.store.now())
        changed = set_condition(
            conditions, "PodScheduled", "False", now, reason="Unschedulable", message=message
        )
        if changed:
            try:
                pod = self.registry.replace(PODS, pod, subresource="status")
            except errors.ApiError as error:
                if error.code == 404:
                    return
                raise
        self._events.warning(pod, "FailedScheduling", message)


def _wants_scheduling(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and spec.get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
        and not is_terminating(pod)
        and not is_terminal(pod)
    )


def _fingerprint(node: Obj) -> str:
    status = node.get("status") or {}
    ready = [c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"]
    relevant: dict[str, Any] = {
        "labels": (node.get("metadata") or {}).get("labels"),
        "spec": node.get("spec"),
        "allocatable": status.get("allocatable"),
        "ready": ready,
    }
    return json.dumps(relevant, sort_keys=True)
