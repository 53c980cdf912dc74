"""Nodes: the Node object a scenario node registers as, and the node lifecycle controller.

The controller does what kube-controller-manager's node lifecycle and pod GC controllers do
here: it keeps the condition taints in step (`node.kubernetes.io/not-ready`,
`/unreachable`, `/unschedulable`), marks a node whose kubelet stopped posting status
`Ready=Unknown` after the grace period, and removes the pods bound to a node that no longer
exists (marked Failed with `DisruptionTarget` first, so their Jobs count them).

As kube-controller-manager's pod GC, it does not collect them at once: a node seen missing
(deleted, or named by a pod but never observed) is quarantined for
`orphan_pod_quarantine_seconds` (40 s), and the pods go on the GC pass after that, which runs
every `pod_gc_period_seconds` (20 s): so the pods of a deleted node stay listed, bound to its
name and in the phase their kubelet last posted, for 40 to 60 s (the pass's offset is drawn
at random per node). A node that comes back within the quarantine keeps its pods.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
import uuid
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from levers9.core.quantity import parse_quantity
from sandbox import errors
from sandbox.cluster.controller import Controller, Watched
from sandbox.cluster.objects import GPU, Obj, condition, is_terminal, set_condition
from sandbox.cluster.predicates import condition_taints
from sandbox.options import DeleteOptions
from sandbox.resources import NODES, PODS
from sandbox.scenario import ClusterInfo, NodeSpec
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

_CONDITION_TAINTS = (
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
)
_PRESSURE = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)
NOT_READY_MESSAGE = (
    "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
    "message:Network plugin returns error: cni plugin not initialized"
)


def capacity(spec: NodeSpec) -> dict[str, str]:
    out = {
        "cpu": spec.cpu,
        "ephemeral-storage": "98831908Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": spec.memory,
        "pods": str(spec.max_pods),
    }
    if spec.gpus.count:
        out[GPU] = str(spec.gpus.count)
    return dict(sorted(out.items()))


def allocatable(spec: NodeSpec) -> dict[str, str]:
    out = capacity(spec)
    cpu = parse_quantity(spec.cpu) - parse_quantity(spec.reserved_cpu)
    memory = parse_quantity(spec.memory) - parse_quantity(spec.reserved_memory)
    if parse_quantity(spec.reserved_cpu):
        out["cpu"] = f"{math.floor(max(cpu, Fraction(0)) * 1000)}m"
    if parse_quantity(spec.reserved_memory):
        out["memory"] = f"{math.floor(max(memory, Fraction(0)) / 1024)}Ki"
    return out


def node_manifest(spec: NodeSpec, cluster: ClusterInfo, pod_cidr: str, now: str) -> Obj:
    """The Node a scenario node registers as (the kubelet's registration, GKE's labels)."""
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
    }
    if spec.gpus.count:
        labels["nvidia.com/gpu.product"] = spec.gpus.product
        labels["nvidia.com/gpu.count"] = str(spec.gpus.count)
    labels.update(spec.labels)
    node_spec: dict[str, Any] = {
        "podCIDR": pod_cidr,
        "podCIDRs": [pod_cidr],
        "providerID": f"gce://{cluster.project}/{cluster.location}/{spec.name}",
    }
    if spec.taints:
        node_spec["taints"] = [t.manifest() for t in spec.taints]
    if spec.unschedulable:
        node_spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": node_spec,
        "status": node_status({}, spec, cluster, spec.ready, now),
    }


def node_status(
    existing: dict[str, Any], spec: NodeSpec, cluster: ClusterInfo, ready: bool, now: str
) -> dict[str, Any]:
    """What a kubelet posts: resources, conditions (every heartbeat stamped), addresses."""
    conditions = [dict(c) for c in existing.get("conditions") or ()]
    for kind, reason, message in _PRESSURE:
        set_condition(
            conditions,
            kind,
            "False",
            now,
            reason=reason,
            message=message,
            time_fields=("lastHeartbeatTime",),
        )
    set_condition(
        conditions,
        "Ready",
        "True" if ready else "False",
        now,
        reason="KubeletReady" if ready else "KubeletNotReady",
        message="kubelet is posting ready status" if ready else NOT_READY_MESSAGE,
        time_fields=("lastHeartbeatTime",),
    )
    for cond in conditions:
        cond["lastHeartbeatTime"] = now
    ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec.name}.{cluster.name}.sandbox")
    status = dict(existing)
    status.update(
        capacity=capacity(spec),
        allocatable=allocatable(spec),
        conditions=conditions,
        addresses=[
            {"type": "InternalIP", "address": spec.internal_ip},
            {"type": "ExternalIP", "address": spec.external_ip},
            {"type": "Hostname", "address": spec.name},
        ],
        daemonEndpoints={"kubeletEndpoint": {"Port": 10250}},
        nodeInfo={
            "machineID": ident.hex,
            "systemUUID": str(ident),
            "bootID": str(uuid.uuid5(ident, "boot")),
            "kernelVersion": "6.6.93+",
            "osImage": "Container-Optimized OS from Google",
            "containerRuntimeVersion": "containerd://1.7.28",
            "kubeletVersion": cluster.kubelet_version,
            "kubeProxyVersion": cluster.kubelet_version,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    )
    return status


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


class NodeLifecycle(Controller[str]):
    """Condition taints, lost heartbeats, and pods left on vanished nodes (see module doc)."""

    name = "node-lifecycle"

    def __init__(
        self,
        registry: Registry,
        resync_s: float,
        grace_s: float,
        quarantine_s: float,
        gc_period_s: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(registry, resync_s)
        self._grace_s = grace_s
        self._quarantine_s = quarantine_s
        self._gc_period_s = gc_period_s
        self._rng = rng or random.Random()
        self._known: set[str] = set()
        self._collect_at: dict[str, float] = {}  # missing node -> when its pods go (loop time)

    def watched(self) -> list[Watched]:
        return [Watched(NODES, self._on_node), Watched(PODS, self._on_pod)]

    def resync_keys(self) -> Iterable[str]:
        return [n["metadata"]["name"] for n in self.registry.list(NODES).items()]

    def _on_node(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            self._known.discard(event.name)
            self.queue.add_after(event.name, self._missing(event.name))
            return
        self._known.add(event.name)
        self._collect_at.pop(event.name, None)
        self.queue.add(event.name)

    def _on_pod(self, event: StoredEvent) -> None:
        node = event.fields.get("spec.nodeName", "")
        if event.type != "DELETED" and node and node not in self._known:
            # Pod GC waits out a quarantine: the node may just not be observed yet.
            self.queue.add_after(node, self._missing(node))

    def collects_at(self, node: str) -> float | None:
        """When (loop time) the pods of `node`, seen missing, are collected; None unless it
        is missing."""
        return self._collect_at.get(node)

    def _missing(self, node: str) -> float:
        """Seconds until the pods of `node`, now seen missing, are collected."""
        now = asyncio.get_running_loop().time()
        when = self._collect_at.get(node)
        if when is None:
            offset = self._rng.uniform(0.0, self._gc_period_s) if self._gc_period_s else 0.0
            when = self._collect_at[node] = now + self._quarantine_s + offset
        return max(when - now, 0.0)

    def reconcile(self, key: str) -> float | None:
        try:
            node = self.registry.get(NODES, None, key)
        except errors.ApiError as error:
            if error.code != 404:
                raise
            wait = self._missing(key)
            if wait > 0:
                return wait  # still in quarantine (another event or timer asked early)
            self._collect_orphans(key)
            self._collect_at.pop(key, None)
            return None
        self._collect_at.pop(key, None)
        node = self._check_heartbeat(node)
        self._sync_taints(node)
        ready = condition(node, "Ready") or {}
        if ready.get("status") == "Unknown":
            return None
        seen = _parse_time(ready.get("lastHeartbeatTime"))
        if seen is None:
            return self._grace_s
        age = (self.registry.store.now() - seen).total_seconds()
        return max(self._grace_s - age, 0.0) + 1.0

    def _check_heartbeat(self, node: Obj) -> Obj:
        ready = condition(node, "Ready")
        if ready is None or ready.get("status") == "Unknown":
            return node
        seen = _parse_time(ready.get("lastHeartbeatTime"))
        now = self.registry.store.now()
        if seen is None or (now - seen).total_seconds() <= self._grace_s:
            return node
        stamp = rfc3339(now)
        for cond in node["status"]["conditions"]:
            cond["status"] = "Unknown"
            cond["reason"] = "NodeStatusUnknown"
            cond["message"] = "Kubelet stopped posting node status."
            cond["lastTransitionTime"] = stamp
        updated: Obj = self.registry.replace(NODES, node, subresource="status")
        return updated

    def _sync_taints(self, node: Obj) -> None:
        spec = node.get("spec") or {}
        current = list(spec.get("taints") or [])
        kept = [t for t in current if t.get("key") not in _CONDITION_TAINTS]
        now = rfc3339(self.registry.store.now())
        wanted = []
        for taint in condition_taints(node):
            old = next(
                (
                    t
                    for t in current
                    if (t.get("key"), t.get("effect")) == (taint["key"], taint["effect"])
                ),
                None,
            )
            if taint["effect"] == "NoExecute":
                taint = {**taint, "timeAdded": (old or {}).get("timeAdded") or now}
            wanted.append(taint)
        desired = kept + wanted
        if desired != current:
            node["spec"] = (
                {**spec, "taints": desired}
                if desired
                else {k: v for k, v in spec.items() if k != "taints"}
            )
            self.registry.replace(NODES, node)

    def _collect_orphans(self, node: str) -> None:
        pods = self.registry.list(PODS, field_selector=f"spec.nodeName={node}").items()
        for pod in pods:
            meta = pod["metadata"]
            if not is_terminal(pod):
                conditions = pod.setdefault("status", {}).setdefault("conditions", [])
                set_condition(
                    conditions,
                    "DisruptionTarget",
                    "True",
                    rfc3339(self.registry.store.now()),
                    reason="DeletionByPodGC",
                    message="PodGC: node no longer exists",
                )
                pod["status"]["phase"] = "Failed"
                try:
                    self.registry.replace(PODS, pod, subresource="status")
                except errors.ApiError as error:
                    if error.code == 404:
                        continue
                    raise
            try:
                self.registry.delete(
                    PODS,
                    meta["namespace"],
                    meta["name"],
                    DeleteOptions(grace_period_seconds=0, precondition_uid=meta["uid"]),
                )
            except errors.ApiError as error:
                if error.code not in (404, 409):
                    raise
