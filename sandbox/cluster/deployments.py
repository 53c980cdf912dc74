"""The Deployment controller (apps/v1), over ReplicaSets as on a real cluster.

For the current pod template it keeps one ReplicaSet named `<deployment>-<pod-template-hash>`
(the hash label is added to its selector and template, so pods read
`model-server-5c9f8d7b6d-x2kq4`), sized to `spec.replicas`; older ReplicaSets are scaled
down as the new one's pods become available (RollingUpdate), or to zero first (Recreate).
Scaling the Deployment scales its ReplicaSet, whose controller deletes the surplus pods.

Status follows the real controller: `replicas`, `updatedReplicas`, `readyReplicas`,
`availableReplicas`, `unavailableReplicas`, `observedGeneration`, and the `Available` and
`Progressing` conditions with their reasons and messages. The revision annotations
(`deployment.kubernetes.io/revision`) are kept. Not emulated: `paused`, progress deadlines,
proportional scaling of several old ReplicaSets, and the real hash's exact value (it is an
FNV-32a of the template's JSON rather than of Go's dump of the struct, encoded the same way).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.cluster.controller import Controller, Watched
from sandbox.cluster.devices import fnv32a
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.objects import (
    Obj,
    controller_uid,
    meta,
    name_of,
    owner_reference,
    set_condition,
    uid_of,
)
from sandbox.cluster.owned import owned, owners_named
from sandbox.patch import PatchType
from sandbox.resources import DEPLOYMENTS, REPLICA_SETS
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # rand.SafeEncodeString's alphabet
Key = tuple[str, str]


def template_hash(template: dict[str, Any], collisions: int = 0) -> str:
    text = json.dumps(template, sort_keys=True, separators=(",", ":")) + str(collisions or "")
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(fnv32a(text.encode())))


def _revision(rs: Obj) -> int:
    try:
        return int((meta(rs).get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _scaled(value: Any, replicas: int, *, round_up: bool) -> int:
    """An int-or-percent of `replicas` (maxSurge rounds up, maxUnavailable down)."""
    text = str(value)
    if text.endswith("%"):
        share = replicas * int(text[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(text)


class DeploymentController(Controller[Key]):
    name = "deployment-controller"

    def __init__(self, registry: Registry, resync_s: float) -> None:
        super().__init__(registry, resync_s)
        self._events = EventRecorder(registry, "deployment-controller")

    def watched(self) -> list[Watched]:
        return [
            Watched(DEPLOYMENTS, self._on_deployment),
            Watched(REPLICA_SETS, self._on_replica_set),
        ]

    def resync_keys(self) -> Iterable[Key]:
        for d in self.registry.list(DEPLOYMENTS).items():
            yield (d["metadata"]["namespace"], name_of(d))

    def _on_deployment(self, event: StoredEvent) -> None:
        self.queue.add((event.namespace, event.name))

    def _on_replica_set(self, event: StoredEvent) -> None:
        for name in owners_named(event.object(), "Deployment"):
            self.queue.add((event.namespace, name))

    def reconcile(self, key: Key) -> float | None:
        namespace, name = key
        deployment = self.registry.find(DEPLOYMENTS, namespace, name)
        if deployment is None or meta(deployment).get("deletionTimestamp"):
            return None
        spec = deployment.get("spec") or {}
        replica_sets = owned(self.registry, REPLICA_SETS, deployment)
        digest = template_hash(spec.get("template") or {})
        new = next(
            (rs for rs in replica_sets if (meta(rs).get("labels") or {}).get(HASH_LABEL) == digest),
            None,
        )
        created = new is None
        if new is None:
            new = self._create_replica_set(deployment, digest, replica_sets)
        old = [rs for rs in replica_sets if uid_of(rs) != uid_of(new)]
        self._scale(deployment, new, old)
        self._annotate(deployment, _revision(new))
        self._write_status(deployment, new, old, created)
        return None

    def _create_replica_set(self, deployment: Obj, digest: str, owned: list[Obj]) -> Obj:
        spec = deployment.get("spec") or {}
        template = copy.deepcopy(spec.get("template") or {})
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: digest}
        selector = copy.deepcopy(spec.get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: digest}
        replicas = int(spec.get("replicas", 1))
        surge = self._max_surge(deployment)
        revision = max((_revision(rs) for rs in owned), default=0) + 1
        rs = {
            "metadata": {
                "name": f"{name_of(deployment)}-{digest}",
                "labels": tmeta["labels"],
                "annotations": {
                    DESIRED: str(replicas),
                    MAX_REPLICAS: str(replicas + surge),
                    REVISION: str(revision),
                },
                "ownerReferences": [owner_reference(DEPLOYMENTS, deployment)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                "selector": selector,
                "template": template,
            },
        }
        namespace = meta(deployment)["namespace"]
        try:
            made: Obj = self.registry.create(REPLICA_SETS, rs, namespace=namespace)
        except errors.ApiError as error:
            if error.code != 409:
                raise
            made = self.registry.get(REPLICA_SETS, namespace, rs["metadata"]["name"])
            if controller_uid(made) != uid_of(deployment):
                raise  # a name collision with a stranger's ReplicaSet: retried with backoff
        return made

    def _max_surge(self, deployment: Obj) -> int:
        spec = deployment.get("spec") or {}
        strategy = spec.get("strategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return 0
        rolling = strategy.get("rollingUpdate") or {}
        return _scaled(rolling.get("maxSurge", "25%"), int(spec.get("replicas", 1)), round_up=True)

    def _max_unavailable(self, deployment: Obj) -> int:
        spec = deployment.get("spec") or {}
        strategy = spec.get("strategy") or {}
        replicas = int(spec.get("replicas", 1))
        if strategy.get("type", "RollingUpdate") != "RollingUpdate" or replicas == 0:
            return 0
        rolling = strategy.get("rollingUpdate") or {}
        return min(
            _scaled(rolling.get("maxUnavailable", "25%"), replicas, round_up=False), replicas
        )

    def _scale(self, deployment: Obj, new: Obj, old: list[Obj]) -> None:
        spec = deployment.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
        old_running = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in old)
        if recreate:
            for rs in old:
                self._set_replicas(deployment, rs, 0)
            self._set_replicas(deployment, new, 0 if old_running else replicas)
            return
        self._set_replicas(deployment, new, replicas)
        # Old pods give way as new ones become available, never below what may be unavailable.
        available = int((new.get("status") or {}).get("availableReplicas", 0))
        keep = max(replicas - self._max_unavailable(deployment) - available, 0)
        for rs in sorted(old, key=_revision, reverse=True):
            current = int((rs.get("spec") or {}).get("replicas", 0))
            target = min(current, keep)
            keep -= target
            self._set_replicas(deployment, rs, target)

    def _set_replicas(self, deployment: Obj, rs: Obj, replicas: int) -> None:
        current = int((rs.get("spec") or {}).get("replicas", 0))
        desired = str(int((deployment.get("spec") or {}).get("replicas", 1)))
        annotations = meta(rs).get("annotations") or {}
        if current == replicas and annotations.get(DESIRED) == desired:
            return
        patch = {"metadata": {"annotations": {DESIRED: desired}}, "spec": {"replicas": replicas}}
        self.registry.patch(
            REPLICA_SETS, meta(rs)["namespace"], name_of(rs), patch, PatchType.MERGE
        )
        rs.setdefault("spec", {})["replicas"] = replicas
        if current != replicas:
            verb = "up" if replicas > current else "down"
            self._events.normal(
                deployment,
                "ScalingReplicaSet",
                f"Scaled {verb} replica set {name_of(rs)} from {current} to {replicas}",
            )

    def _annotate(self, deployment: Obj, revision: int) -> None:
        annotations = meta(deployment).get("annotations") or {}
        if annotations.get(REVISION) == str(revision):
            return
        patch = {"metadata": {"annotations": {REVISION: str(revision)}}}
        updated = self.registry.patch(
            DEPLOYMENTS, meta(deployment)["namespace"], name_of(deployment), patch, PatchType.MERGE
        )
        deployment["metadata"] = updated["metadata"]

    def _write_status(self, deployment: Obj, new: Obj, old: list[Obj], created: bool) -> None:
        spec = deployment.get("spec") or {}
        wanted = int(spec.get("replicas", 1))

        def total(field: str, sets: list[Obj]) -> int:
            return sum(int((rs.get("status") or {}).get(field, 0)) for rs in sets)

        every = [new, *old]
        available = total("availableReplicas", every)
        updated = total("replicas", [new])
        status: dict[str, Any] = copy.deepcopy(deployment.get("status") or {})
        status.update(
            observedGeneration=meta(deployment).get("generation", 1),
            replicas=total("replicas", every),
            updatedReplicas=updated,
            readyReplicas=total("readyReplicas", every),
            availableReplicas=available,
            unavailableReplicas=max(total("replicas", every) - available, wanted - available, 0),
        )
        for field in (
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ):
            if not status[field]:
                del status[field]
        now = rfc3339(self.registry.store.now())
        conditions = status.setdefault("conditions", [])
        stamps = ("lastUpdateTime",)
        if available >= wanted - self._max_unavailable(deployment):
            set_condition(
                conditions,
                "Available",
                "True",
                now,
                reason="MinimumReplicasAvailable",
                message="Deployment has minimum availability.",
                time_fields=stamps,
            )
        else:
            set_condition(
                conditions,
                "Available",
                "False",
                now,
                reason="MinimumReplicasUnavailable",
                message="Deployment does not have minimum availability.",
                time_fields=stamps,
            )
        rs_name = name_of(new)
        done = updated == wanted and available >= wanted and total("replicas", old) == 0
        if done:
            progress = (
                "NewReplicaSetAvailable",
                f'ReplicaSet "{rs_name}" has successfully progressed.',
            )
        elif created:
            progress = ("NewReplicaSetCreated", f'Created new replica set "{rs_name}"')
        else:
            progress = ("ReplicaSetUpdated", f'ReplicaSet "{rs_name}" is progressing.')
        set_condition(
            conditions,
            "Progressing",
            "True",
            now,
            reason=progress[0],
            message=progress[1],
            time_fields=stamps,
        )
        conditions.sort(key=lambda c: 0 if c["type"] == "Available" else 1)
        if status != deployment.get("status"):
            deployment["status"] = status
            self.registry.replace(DEPLOYMENTS, deployment, subresource="status")
