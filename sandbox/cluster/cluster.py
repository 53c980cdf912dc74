"""The cluster behind the sandbox's API: its nodes' kubelets and the control-plane controllers,
started and stopped as one, loaded from a scenario, changed by scenario commands.

    registry = Registry()
    cluster = Cluster(registry, Scenario.load(), state_dir=Path(".levers9/sandbox"))
    await cluster.start()          # nodes registered, controllers and kubelets running,
                                   # the scenario's objects created
    await cluster.add_node(spec)   # scenario commands: add_node, remove_node,
    await cluster.set_node_ready("gke-...", False)   # set_node_ready, add_image, remove_image
    cluster.logs.read(...)         # container output (the registry's PodLogs)
    await cluster.stop()           # every process stopped, every task ended

Everything acts through the registry's API, as the real components act through the API
server; nothing here reaches into the store. A kubelet runs for every Node object (one made
through the API gets a kubelet too, sized from its status), and stops when its Node is
deleted; the node's pods are then collected by the node lifecycle controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from levers9.logs import get_logger
from sandbox import errors, strays
from sandbox.cluster.controller import watch_forever
from sandbox.cluster.deployments import DeploymentController
from sandbox.cluster.images import ImageSet, ProcessImage
from sandbox.cluster.jobs import JobController
from sandbox.cluster.kubelet import Kubelet
from sandbox.cluster.nodes import NodeLifecycle, node_manifest
from sandbox.cluster.objects import GPU, Obj, node_address
from sandbox.cluster.replicasets import ReplicaSetController
from sandbox.cluster.scheduler import Scheduler
from sandbox.options import DeleteOptions
from sandbox.patch import PatchType
from sandbox.podlogs import PodLogs
from sandbox.resources import NAMESPACES, NODES
from sandbox.scenario import LOOPBACK, Gpus, Network, NodeSpec, Scenario
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

log = get_logger("sandbox.cluster")
PREEMPTION_TAINT = "cloud.google.com/impending-node-termination"
"""The taint GKE's node termination handler puts on a spot VM's node at its preemption notice
(the controlplane reads it: levers9.core.capacity.PREEMPTION_TAINT)."""

POD_NETWORK = ipaddress.IPv4Network("127.64.0.0/10")  # node pod CIDRs are /24s of this
STOP_GRACE_S = 5.0  # how long containers get to exit when the whole sandbox stops
RESTART_PAUSE_S = 1.0  # before a crashed component starts again


class Cluster:
    """Controllers + kubelets over a registry (see module doc)."""

    def __init__(
        self,
        registry: Registry,
        scenario: Scenario,
        state_dir: Path,
        *,
        api_address: tuple[str, int] | None = None,
        nodes: Sequence[NodeSpec] | None = None,
    ) -> None:
        """`nodes`: the nodes of a saved cluster (`sandbox.persist`), whose objects the store
        already holds; None starts from the scenario's nodes and creates its objects."""
        if api_address is not None and ipaddress.IPv4Address(api_address[0]) not in LOOPBACK:
            raise ValueError(f"the sandbox API must listen on loopback, not {api_address[0]}")
        self.registry = registry
        self.scenario = scenario
        self.state_dir = state_dir.resolve()
        self.api_address = api_address
        self.images = ImageSet(
            scenario.images.present,
            {ref: ProcessImage(p.entrypoint, p.cmd) for ref, p in scenario.images.process.items()},
            scenario.images.pull_seconds,
            scenario.images.mirrors,
            process_tasks=scenario.images.process_tasks,
        )
        self._restored = nodes is not None
        self._specs: dict[str, NodeSpec] = {
            n.name: n for n in (scenario.nodes if nodes is None else nodes)
        }
        self._cidrs: dict[str, str] = {}
        self._kubelets: dict[str, tuple[Kubelet, asyncio.Task[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.node_lifecycle: NodeLifecycle | None = None
        """Its node lifecycle controller, once started (tests read when it collects pods)."""
        self._stopping: set[asyncio.Task[None]] = set()
        self._preemptions: set[asyncio.Task[None]] = set()
        """Announced preemptions, each removing its node at its notice's end."""

    @property
    def logs(self) -> PodLogs:
        return self.registry.logs

    @property
    def network(self) -> Network:
        """Egress IPs and authorized networks, for the API server to enforce."""
        return self.scenario.network

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        timing = self.scenario.timing
        registry = self.registry
        for spec in self._specs.values():
            self._register(spec)
        self.node_lifecycle = NodeLifecycle(
            registry,
            timing.resync_seconds,
            timing.node_monitor_grace_seconds,
            timing.orphan_pod_quarantine_seconds,
            timing.pod_gc_period_seconds,
        )
        controllers = (
            Scheduler(registry, timing.resync_seconds),
            self.node_lifecycle,
            JobController(registry, timing),
            ReplicaSetController(registry, timing.resync_seconds),
            DeploymentController(registry, timing.resync_seconds),
        )
        self._tasks = [
            asyncio.create_task(_supervise(c.name, c.run), name=c.name) for c in controllers
        ]
        self._tasks.append(
            asyncio.create_task(watch_forever(registry, NODES, self._on_node), name="kubelets")
        )
        for name in list(self._specs):
            self._ensure_kubelet(name)
        if not self._restored:
            self._apply_objects()

    async def stop(self) -> None:
        tasks, self._tasks = [*self._tasks, *self._preemptions], []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._stop_kubelet(n, STOP_GRACE_S) for n in list(self._kubelets)))
        await asyncio.gather(*self._stopping, return_exceptions=True)
        await self._sweep()

    async def _sweep(self) -> None:
        """What the nodes' worker agents left (`sandbox.strays`): an agent stopped by SIGKILL
        (slower than the grace) leaves its tasks' containers and processes running, in sessions
        of their own; they go with the machine's processes, as on a reboot."""
        found = await asyncio.to_thread(strays.find, self.state_dir, stack_running=False)
        if found:
            left = await asyncio.to_thread(
                strays.remove, self.state_dir, found, lambda line: log.info(line)
            )
            for stray in left:
                log.warning("stray left behind", kind=stray.kind, name=stray.name)

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- scenario commands -------------------------------------------------------------------

    async def add_node(self, spec: NodeSpec) -> None:
        """A new machine joins: its Node registers and its kubelet starts."""
        self._specs[spec.name] = spec
        self._register(spec)
        self._ensure_kubelet(spec.name)

    async def remove_node(self, name: str) -> None:
        """The machine is gone: its processes die at once and its Node is deleted."""
        await self._stop_kubelet(name, 0.0)
        with contextlib.suppress(errors.ApiError):
            self.registry.delete(NODES, None, name, DeleteOptions())
        self._specs.pop(name, None)
        self._cidrs.pop(name, None)

    def preempt_node(self, name: str, notice_s: float) -> None:
        """A spot VM's preemption, announced: its Node is tainted `PREEMPTION_TAINT` now (as
        GKE's node termination handler does on the notice) and the machine goes when the
        notice ends (its processes die, its Node is deleted: `remove_node`)."""
        node = self.registry.get(NODES, None, name)
        taints = [t for t in (node.get("spec") or {}).get("taints") or ()]
        if not any(t.get("key") == PREEMPTION_TAINT for t in taints):
            taints.append({"key": PREEMPTION_TAINT, "value": "true", "effect": "NoSchedule"})
            self.registry.patch(NODES, None, name, {"spec": {"taints": taints}}, PatchType.MERGE)
        log.info("node preemption announced", node=name, notice_s=notice_s)

        async def goes() -> None:
            await asyncio.sleep(notice_s)
            log.info("node preempted: its VM is gone", node=name)
            await self.remove_node(name)

        task = asyncio.create_task(goes())
        self._preemptions.add(task)
        task.add_done_callback(self._preemptions.discard)

    async def set_node_ready(self, name: str, ready: bool) -> None:
        """The node's kubelet reports Ready or NotReady from its next (immediate) status."""
        spec = self._specs.get(name)
        if spec is not None:
            self._specs[name] = spec.model_copy(update={"ready": ready})
        entry = self._kubelets.get(name)
        if entry is None:
            raise KeyError(f"no kubelet runs for node {name}")
        entry[0].set_ready(ready)

    def node_specs(self) -> list[NodeSpec]:
        """The nodes as the scenario (and its commands since) describe them."""
        return list(self._specs.values())

    def add_image(self, reference: str) -> None:
        """The registries now hold `reference`: pulls of it succeed from their next retry."""
        self.images.add(reference)

    def remove_image(self, reference: str) -> None:
        self.images.remove(reference)

    def kubelet(self, name: str) -> Kubelet | None:
        entry = self._kubelets.get(name)
        return None if entry is None else entry[0]

    def node_root(self, name: str) -> Path:
        """The directory that is node `name`'s filesystem root (hostPath volumes live here)."""
        return self.state_dir / "nodes" / name

    # -- nodes and kubelets ------------------------------------------------------------------

    def _register(self, spec: NodeSpec) -> None:
        if self.registry.store.exists(NODES, None, spec.name):
            return
        now = rfc3339(self.registry.store.now())
        self.registry.create(
            NODES, node_manifest(spec, self.scenario.cluster, self._pod_cidr(spec), now)
        )

    def _pod_cidr(self, spec: NodeSpec) -> str:
        """The node IPAM controller's choice: the node's own range, or the next free /24."""
        if spec.pod_cidr is not None:
            self._cidrs[spec.name] = spec.pod_cidr
        if spec.name not in self._cidrs:
            used = set(self._cidrs.values())
            self._cidrs[spec.name] = next(
                str(n) for n in POD_NETWORK.subnets(new_prefix=24) if str(n) not in used
            )
        return self._cidrs[spec.name]

    def _on_node(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            if event.name in self._kubelets:
                task = asyncio.create_task(self._stop_kubelet(event.name, 0.0))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
            return
        if event.name not in self._kubelets:
            node = event.object()
            if event.name not in self._specs:
                self._specs[event.name] = _spec_from_node(node)
            cidr = (node.get("spec") or {}).get("podCIDR")
            if cidr and event.name not in self._cidrs:
                self._cidrs[event.name] = str(cidr)
            self._ensure_kubelet(event.name)

    def _ensure_kubelet(self, name: str) -> None:
        if name in self._kubelets or not self._tasks:
            return
        spec = self._specs[name]
        kubelet = Kubelet(
            self.registry,
            spec,
            self.scenario.cluster,
            self._pod_cidr(spec),
            self.images,
            self.scenario.timing,
            self.state_dir,
            self.api_address,
        )
        task = asyncio.create_task(_supervise(f"kubelet {name}", kubelet.run), name=name)
        self._kubelets[name] = (kubelet, task)

    async def _stop_kubelet(self, name: str, grace_s: float) -> None:
        entry = self._kubelets.pop(name, None)
        if entry is None:
            return
        kubelet, task = entry
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kubelet.shutdown(grace_s)

    # -- the scenario's objects --------------------------------------------------------------

    def _apply_objects(self) -> None:
        for obj in self.scenario.objects:
            resource = self.registry.catalog.by_kind(str(obj["apiVersion"]), str(obj["kind"]))
            if resource is None:
                raise ValueError(
                    f"scenario object of unknown kind {obj['apiVersion']}/{obj['kind']}"
                )
            namespace = None
            if resource.namespaced:
                namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
                self._ensure_namespace(namespace)
            try:
                self.registry.create(resource, obj, namespace=namespace)
            except errors.ApiError as error:
                if error.code != 409:
                    raise

    def _ensure_namespace(self, name: str) -> None:
        if not self.registry.store.exists(NAMESPACES, None, name):
            self.registry.create(NAMESPACES, {"metadata": {"name": name}})


async def _supervise(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Runs a component until cancelled, restarting it after a crash, as a controller
    manager's process supervisor would: a bug costs a restart, not the cluster."""
    while True:
        try:
            await run()
        except Exception:
            log.exception("component crashed, restarting", component=name)
        await asyncio.sleep(RESTART_PAUSE_S)


def _spec_from_node(node: Obj) -> NodeSpec:
    """What a kubelet needs for a Node made through the API: read back from the object."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    meta = node.get("metadata") or {}

    def loopback(kind: str) -> str:
        address = node_address(node, kind) or "127.0.0.1"
        try:
            return address if ipaddress.IPv4Address(address) in LOOPBACK else "127.0.0.1"
        except ValueError:
            return "127.0.0.1"

    fields: dict[str, Any] = {
        "name": meta.get("name"),
        "labels": meta.get("labels") or {},
        "cpu": str(capacity.get("cpu", "8")),
        "memory": str(capacity.get("memory", "32Gi")),
        "max_pods": int(capacity.get("pods", 110)),
        "gpus": Gpus(count=int(capacity.get(GPU, 0))),
        "internal_ip": loopback("InternalIP"),
        "external_ip": loopback("ExternalIP"),
    }
    return NodeSpec.model_validate(fields)
