"""The sandbox's cluster kept across a stop and a start, as a real cluster keeps its objects in
etcd when its machines are powered down and up.

`cluster.json` in the sandbox's state directory holds every stored object (uid,
resourceVersion, creationTimestamp and all) with the store's resourceVersion counter, and the
nodes as the cluster runs them (the scenario's, and those added since with their names,
labels, GPUs and pod ranges). It is written atomically (0600: it holds Secrets) every
`SAVE_PERIOD_S` when something changed, and on a clean stop after every process stopped, so a
crash loses at most the last seconds. A start that finds it loads it instead of the scenario's
nodes and objects (the scenario still says the images, timings and network); a start without
it (a first start, a state directory from before this file existed, `--fresh`) is the
scenario's.

What loading does to pods is what a power cycle does: their processes died with the machine.
GKE's nodes shut down gracefully (the kubelet's node shutdown manager, on by default), so a pod
that was bound to a node and not finished is `Failed`, reason `Terminated`, "Pod was terminated
in response to imminent node shutdown.", with a `DisruptionTarget` condition
(`TerminationByKubelet`), and stays listed until pod GC; one already being deleted is gone.
Controllers then do what they do after a node restart: a ReplicaSet (a Deployment's) creates a
replacement, a Job counts the failure against its `backoffLimit` (no `podFailurePolicy` here:
the worker Job's `backoffLimit: 0` fails the Job, and the controlplane's reconcile replaces the
worker). Pods not yet bound wait for the scheduler as before. Events older than their TTL
(the apiserver's `--event-ttl`, 1 h) expired in etcd meanwhile: they are not loaded.

    snapshot = persist.load(state_dir)          # None: no file; SnapshotError: unreadable
    persist.restore(store, snapshot)            # into an empty store, before the registry
    saver = Saver(state_dir, store, cluster.node_specs); saver.start(); await saver.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from levers9.files import write_private
from levers9.logs import get_logger
from sandbox.cluster.objects import is_terminal, set_condition
from sandbox.resources import EVENTS, NODES, PODS, Resource, ResourceCatalog
from sandbox.scenario import NodeSpec
from sandbox.store import Store, rfc3339

log = get_logger("sandbox.persist")

SNAPSHOT_FILE = "cluster.json"
FORMAT = "levers9-sandbox-cluster/1"
SAVE_PERIOD_S = 2.0
FRESH = "`levers9 dev up --fresh` (or `levers9 sandbox serve --fresh`)"
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
EVENT_TTL = dt.timedelta(hours=1)


class SnapshotError(Exception):
    """A saved cluster that cannot be loaded, with the file and the way out."""


@dataclass(frozen=True)
class Snapshot:
    """A saved cluster: the store's counter, its objects, its nodes."""

    resource_version: int
    objects: list[tuple[Resource, dict[str, Any]]]
    nodes: list[NodeSpec]


def snapshot_path(state_dir: Path) -> Path:
    return state_dir / SNAPSHOT_FILE


def _resource_id(resource: Resource) -> str:
    return f"{resource.group}/{resource.version}/{resource.plural}"


def dump(store: Store, nodes: Iterable[NodeSpec]) -> bytes:
    """The snapshot's bytes: the stored bytes of each object, joined without re-encoding.
    Only nodes that still have a Node object are kept (one deleted through the API is gone)."""
    kept = []
    for spec in nodes:
        if not store.exists(NODES, None, spec.name):
            continue
        if spec.pod_cidr is None:  # the IPAM's choice, kept as the Node says it
            cidr = (store.get(NODES, None, spec.name).get("spec") or {}).get("podCIDR")
            spec = spec.model_copy(update={"pod_cidr": cidr})
        kept.append(spec.model_dump(mode="json", by_alias=True))
    head = {
        "format": FORMAT,
        "savedAt": rfc3339(store.now()),
        "resourceVersion": store.resource_version,
        "nodes": kept,
    }
    objects = b",\n".join(
        b'{"resource":' + json.dumps(_resource_id(r)).encode() + b',"object":' + raw + b"}"
        for r, raw in store.objects()
    )
    return json.dumps(head)[:-1].encode() + b',"objects":[\n' + objects + b"\n]}\n"


def save(state_dir: Path, store: Store, nodes: Iterable[NodeSpec]) -> Path:
    path = snapshot_path(state_dir)
    write_private(path, dump(store, nodes).decode())
    return path


def load(state_dir: Path, catalog: ResourceCatalog | None = None) -> Snapshot | None:
    """The saved cluster, or None when there is none (start from the scenario)."""
    path = snapshot_path(state_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unreadable(path, exc.strerror or str(exc)) from None
    catalog = catalog or ResourceCatalog()
    try:
        data = json.loads(text)
        found = data.get("format") if isinstance(data, dict) else None
        if found == FORMAT:
            objects = [_saved_object(catalog, item) for item in data["objects"]]
            nodes = [NodeSpec.model_validate(node) for node in data["nodes"]]
            return Snapshot(int(data["resourceVersion"]), objects, nodes)
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise _unreadable(path, _first_line(exc)) from None
    raise _unreadable(path, f"format {found!r}, not {FORMAT!r}")


def _saved_object(catalog: ResourceCatalog, item: dict[str, Any]) -> tuple[Resource, Any]:
    group, version, plural = str(item["resource"]).split("/")
    resource = catalog.lookup(group, version, plural)
    if resource is None:
        raise ValueError(f"no resource {item['resource']} is served")
    obj = item["object"]
    meta = obj["metadata"]
    if not (meta["name"] and meta["uid"] and int(meta["resourceVersion"]) > 0):
        raise ValueError(f"a {resource.kind} without name, uid or resourceVersion")
    return resource, obj


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _unreadable(path: Path, why: str) -> SnapshotError:
    return SnapshotError(
        f"the sandbox's saved cluster {path} cannot be loaded ({why}); start from the scenario"
        f" again with {FRESH}, which replaces it"
    )


def restore(store: Store, snapshot: Snapshot) -> int:
    """Loads `snapshot` into an empty store, after the power cycle (see module doc); returns
    how many pods it ended."""
    now = rfc3339(store.now())
    expired = store.now() - EVENT_TTL
    rv = snapshot.resource_version
    objects: list[tuple[Resource, dict[str, Any]]] = []
    ended = 0
    for resource, obj in snapshot.objects:
        if resource is EVENTS and _last_seen(obj) < expired:
            continue
        if resource is PODS and (obj.get("spec") or {}).get("nodeName") and not is_terminal(obj):
            meta = obj["metadata"]
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                continue  # its kubelet would have confirmed the delete
            rv = max(rv, int(meta["resourceVersion"])) + 1
            meta["resourceVersion"] = str(rv)
            _shut_down(obj, now)
            ended += 1
        objects.append((resource, obj))
    store.restore(objects, rv)
    return ended


def _last_seen(event: dict[str, Any]) -> dt.datetime:
    """When the event was last recorded (its TTL starts again at each update)."""
    meta = event.get("metadata") or {}
    for stamp in (
        event.get("lastTimestamp"),
        event.get("eventTime"),
        meta.get("creationTimestamp"),
    ):
        if isinstance(stamp, str):
            with contextlib.suppress(ValueError):
                return dt.datetime.fromisoformat(stamp).astimezone(dt.UTC)
    return dt.datetime.min.replace(tzinfo=dt.UTC)


def _shut_down(pod: dict[str, Any], now: str) -> None:
    """The status the node shutdown manager leaves on a pod it killed."""
    status = pod.setdefault("status", {})
    status["phase"] = "Failed"
    status["reason"] = SHUTDOWN_REASON
    status["message"] = SHUTDOWN_MESSAGE
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            state = container.get("state") or {}
            if "terminated" not in state:
                started = (state.get("running") or {}).get("startedAt")
                terminated = {"exitCode": 137, "reason": "Error", "finishedAt": now}
                container["state"] = {"terminated": {**terminated, "startedAt": started}}
            container["ready"] = False
            container["started"] = False
    names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or ()]
    conditions = status.setdefault("conditions", [])
    set_condition(conditions, "PodReadyToStartContainers", "False", now)
    for kind in ("Ready", "ContainersReady"):
        set_condition(
            conditions,
            kind,
            "False",
            now,
            reason="ContainersNotReady",
            message=f"containers with unready status: [{' '.join(names)}]",
        )
    set_condition(
        conditions,
        "DisruptionTarget",
        "True",
        now,
        reason="TerminationByKubelet",
        message=SHUTDOWN_MESSAGE,
    )


class Saver:
    """Writes the snapshot every `period_s` when the store changed, and once more at `stop`."""

    def __init__(
        self,
        state_dir: Path,
        store: Store,
        nodes: Callable[[], Iterable[NodeSpec]],
        period_s: float = SAVE_PERIOD_S,
    ) -> None:
        self._dir = state_dir
        self._store = store
        self._nodes = nodes
        self._period_s = period_s
        self._saved_rv = -1
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.save()
        self._task = asyncio.create_task(self._run(), name="persist")

    def save(self) -> None:
        """Writes the snapshot now, unless nothing changed since the last one."""
        rv = self._store.resource_version
        if rv == self._saved_rv:
            return
        save(self._dir, self._store, self._nodes())
        self._saved_rv = rv

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            try:
                self.save()
            except OSError as exc:  # a full disk costs the snapshot, not the cluster
                log.warning("cluster not saved", path=str(snapshot_path(self._dir)), error=str(exc))

    async def stop(self) -> None:
        """Stops the periodic saves and writes the final state."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.save()


def forget(state_dir: Path) -> bool:
    """Removes the saved cluster (`--fresh`); whether there was one."""
    path = snapshot_path(state_dir)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed
