"""The kubelet of one node: admission, pod workers, GPU devices, heartbeats.

It watches the pods bound to its node (`spec.nodeName`), as a kubelet does, and declares
itself to the registry (`attach_kubelet`) so that deleting one of those pods waits for it to
stop the containers. A new pod is admitted against what the node has left, in the order the
kubelet sees them: one that does not fit (a pod placed with `spec.nodeName` by hand) fails at
once with `OutOf<resource>`, as kubelets reject it; an admitted pod gets its GPUs (lowest
free ids, recorded in the device-plugin checkpoint) and a pod worker (`podworker`). Every
`heartbeat_seconds` it posts the node's status (Ready, or NotReady when a scenario says so)
and renews the node's Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import stat
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from levers9.contract import NVIDIA_MAJOR, NVIDIACTL_MINOR
from levers9.logs import get_logger
from sandbox import errors
from sandbox.cluster.controller import watch_forever
from sandbox.cluster.devices import DeviceManager, allocate_response
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.images import ImagePuller, ImageSet
from sandbox.cluster.nodes import allocatable as node_allocatable
from sandbox.cluster.nodes import node_status
from sandbox.cluster.objects import (
    GPU,
    Obj,
    is_terminal,
    is_terminating,
    name_of,
    uid_of,
)
from sandbox.cluster.podworker import PodWorker
from sandbox.cluster.predicates import matches_node_affinity
from sandbox.cluster.requests import (
    PODS as PODS_RESOURCE,
)
from sandbox.cluster.requests import (
    Amounts,
    add,
    container_requests,
    in_units,
    insufficient,
    parse_amounts,
    pod_requests,
)
from sandbox.resources import LEASES, NODES, PODS
from sandbox.scenario import ClusterInfo, NodeSpec, Timing
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

DRIVER_DIRS = ("usr/local/nvidia/lib64", "usr/local/nvidia/bin")


def make_device_nodes(dev: Path, cards: int) -> None:
    """The node's `/dev/nvidiaN` and `/dev/nvidiactl`, as the NVIDIA driver makes them: real
    character devices (no driver answers them here), so what a container is given of them is
    tested for real. Needs CAP_MKNOD (root); without it the node has none, and says so."""
    dev.mkdir(parents=True, exist_ok=True)
    nodes = [(f"nvidia{i}", i) for i in range(cards)] + [("nvidiactl", NVIDIACTL_MINOR)]
    for name, minor in nodes:
        path = dev / name
        if path.exists():
            continue
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        except PermissionError:
            log.warning("no device nodes for the node's cards: mknod needs root", dev=str(dev))
            return


log = get_logger("sandbox.kubelet")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40


class IpPool:
    """Pod IPs from the node's pod CIDR, lowest free first (the gateway `.1` is skipped)."""

    def __init__(self, cidr: str) -> None:
        network = ipaddress.IPv4Network(cidr)
        self._hosts = [str(h) for h in network.hosts()][1:]
        self._taken: dict[str, str] = {}

    def assign(self, owner: str) -> str | None:
        if owner in self._taken:
            return self._taken[owner]
        used = set(self._taken.values())
        for host in self._hosts:
            if host not in used:
                self._taken[owner] = host
                return host
        return None

    def release(self, owner: str) -> None:
        self._taken.pop(owner, None)


class Kubelet:
    """One node's kubelet (see module doc). `run` until cancelled, then `shutdown`."""

    def __init__(
        self,
        registry: Registry,
        spec: NodeSpec,
        cluster: ClusterInfo,
        pod_cidr: str,
        images: ImageSet,
        timing: Timing,
        state_dir: Path,
        api_address: tuple[str, int] | None = None,
    ) -> None:
        self.registry = registry
        self.spec = spec
        self.name = spec.name
        self.images = images
        self.timing = timing
        self.api_address = api_address
        self.root = state_dir / "nodes" / spec.name
        self.host_ip = spec.internal_ip
        self.logs = registry.logs
        self.events = EventRecorder(registry, "kubelet", spec.name)
        self.puller = ImagePuller(images, self.events, timing)
        registered = {GPU: spec.gpus.device_ids(spec.name)} if spec.gpus.count else {}
        self.devices = DeviceManager(self.root, registered)
        self._cluster = cluster
        self._ips = IpPool(pod_cidr)
        self._workers: dict[str, PodWorker] = {}
        self._admitted: dict[str, Amounts] = {}
        self._ready = spec.ready
        self._wake = asyncio.Event()
        self._node: Obj = {}

    # -- what pod workers use ----------------------------------------------------------------

    def node_object(self) -> Obj:
        return self._node

    def pod_dir(self, uid: str) -> Path:
        return self.root / "var" / "lib" / "kubelet" / "pods" / uid

    def assign_ip(self, uid: str, spec: dict[str, Any]) -> str | None:
        if spec.get("hostNetwork"):
            return self.host_ip
        return self._ips.assign(uid)

    def device_env(self, uid: str, container: str) -> dict[str, str]:
        ids = self.devices.allocated(uid).get(container)
        if not ids:
            return {}
        return dict(allocate_response(ids).envs)

    def release(self, uid: str) -> None:
        """A pod finished: its cards, IP and resources go back to the node."""
        self.devices.release(uid)
        self._ips.release(uid)
        self._admitted.pop(uid, None)

    # -- scenario hooks ----------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        """Reports the new readiness now (so the API shows it when this returns)."""
        self._ready = ready
        try:
            self._post_status()
        except errors.ApiError as error:
            log.warning("node status not posted", node=self.name, code=error.code)

    @property
    def ready(self) -> bool:
        return self._ready

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        detach = self.registry.attach_kubelet(self.name)
        try:
            # The device-plugin directory exists on every node (the kubelet's socket lives
            # there), so a hostPath of type Directory on it mounts anywhere.
            self.devices.path.parent.mkdir(parents=True, exist_ok=True)
            if self.devices.registered():
                self.devices.write()
                # GKE's driver installer puts the NVIDIA driver under /usr/local/nvidia on GPU
                # nodes; here the directories exist and hold no driver (there is no GPU).
                for driver_dir in DRIVER_DIRS:
                    (self.root / driver_dir).mkdir(parents=True, exist_ok=True)
                make_device_nodes(self.root / "dev", len(self.devices.registered()))
            with contextlib.suppress(errors.ApiError):
                self._post_status()  # admission reads the node's labels
            async with asyncio.TaskGroup() as group:
                group.create_task(self._heartbeat())
                group.create_task(
                    watch_forever(
                        self.registry,
                        PODS,
                        self._on_pod,
                        field_selector=f"spec.nodeName={self.name}",
                    )
                )
        finally:
            detach()

    async def shutdown(self, grace_s: float) -> None:
        """The node goes away: every container stops within `grace_s`, nothing is written."""
        workers = list(self._workers.values())
        self._workers.clear()
        await asyncio.gather(*(w.abandon(grace_s) for w in workers))

    async def _heartbeat(self) -> None:
        while True:
            self._wake.clear()
            try:
                self._post_status()
                self._renew_lease()
            except errors.ApiError as error:
                log.warning("node status not posted", node=self.name, code=error.code)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timing.heartbeat_seconds)

    def _post_status(self) -> None:
        node = self.registry.find(NODES, None, self.name)
        if node is None:
            return  # deregistered: the cluster stops this kubelet
        now = rfc3339(self.registry.store.now())
        status = node_status(node.get("status") or {}, self.spec, self._cluster, self._ready, now)
        status["images"] = [
            {"names": [image], "sizeBytes": 1 << 30} for image in sorted(self.puller.pulled)
        ]
        node["status"] = status
        self._node = self.registry.replace(NODES, node, subresource="status")

    def _renew_lease(self) -> None:
        now = self.registry.store.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            lease = self.registry.get(LEASES, LEASE_NAMESPACE, self.name)
        except errors.ApiError as error:
            if error.code != 404:
                raise
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.name,
                "uid": uid_of(self._node),
            }
            self.registry.create(
                LEASES,
                {
                    "metadata": {
                        "name": self.name,
                        "namespace": LEASE_NAMESPACE,
                        "ownerReferences": [owner] if owner["uid"] else [],
                    },
                    "spec": {
                        "holderIdentity": self.name,
                        "leaseDurationSeconds": LEASE_SECONDS,
                        "renewTime": now,
                    },
                },
            )
            return
        lease.setdefault("spec", {})["renewTime"] = now
        self.registry.replace(LEASES, lease)

    # -- pods --------------------------------------------------------------------------------

    def _on_pod(self, event: StoredEvent) -> None:
        worker = self._workers.get(event.uid)
        if event.type == "DELETED":
            if worker is not None:
                del self._workers[event.uid]
                worker.removed()
            return
        pod = event.object()
        if worker is not None:
            worker.update(pod)
            return
        if not is_terminal(pod) and not is_terminating(pod):
            rejection = self._admit(pod)
            if rejection is not None:
                pod = self._reject(pod, *rejection)
        worker = PodWorker(self, pod)
        self._workers[event.uid] = worker
        worker.start()
        worker.update(pod)

    def _admit(self, pod: Obj) -> tuple[str, str] | None:
        """The kubelet's admission: resources first, then node affinity; assigns the GPUs."""
        request = pod_requests(pod)
        request[PODS_RESOURCE] = Fraction(1)
        capacity = parse_amounts(node_allocatable(self.spec))
        used: Amounts = {}
        for amounts in self._admitted.values():
            add(used, amounts)
        free = dict(capacity)
        add(free, used, sign=-1)
        short = insufficient(request, free)
        if short:
            name = short[0]
            return f"OutOf{name}", (
                f"Node didn't have enough resource: {name}, requested: "
                f"{in_units(name, request[name])}, used: "
                f"{in_units(name, used.get(name, Fraction(0)))}, capacity: "
                f"{in_units(name, capacity.get(name, Fraction(0)))}"
            )
        if not matches_node_affinity(pod, self._node or {"metadata": {"labels": {}}}):
            return "NodeAffinity", "Predicate NodeAffinity failed"
        self._admitted[uid_of(pod)] = request
        self._assign_devices(pod)
        return None

    def _assign_devices(self, pod: Obj) -> None:
        uid = uid_of(pod)
        spec = pod.get("spec") or {}
        for container in spec.get("containers") or ():
            count = int(container_requests(container).get(GPU, 0))
            if count:
                self.devices.allocate(uid, container["name"], count)
        # Init containers reuse the cards the pod's containers got, as the device manager's
        # "devices to reuse" does; only a larger init request takes more.
        pool = [d for ids in self.devices.allocated(uid).values() for d in ids]
        for container in spec.get("initContainers") or ():
            count = int(container_requests(container).get(GPU, 0))
            if count and count > len(pool):
                self.devices.allocate(uid, container["name"], count)
            elif count:
                self.devices.assign(uid, container["name"], pool[:count])

    def _reject(self, pod: Obj, reason: str, message: str) -> Obj:
        self.events.warning(pod, reason, message)
        status = pod.get("status") or {}
        pod["status"] = {
            "phase": "Failed",
            "conditions": [
                c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"
            ],
            "reason": reason,
            "message": f"Pod was rejected: {message}",
            "qosClass": status.get("qosClass", "BestEffort"),
        }
        try:
            updated: Obj = self.registry.replace(PODS, pod, subresource="status")
        except errors.ApiError as error:
            log.warning("pod rejection not written", pod=name_of(pod), code=error.code)
            return pod
        return updated

    def workers(self) -> dict[str, PodWorker]:
        return dict(self._workers)
