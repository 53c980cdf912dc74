"""The garbage collector and the namespace lifecycle: what kube-controller-manager does after
a delete.

Both react to committed store events (synchronously, as a store listener), so by the time a
DELETE returns its cascade has been carried out as far as it can go without a kubelet:

- an owner deleted in the Background (or gone with no policy on its dependents) takes its
  dependents with it, unless another live owner holds them (then only the dangling reference
  is dropped);
- an owner deleted in the Foreground keeps `foregroundDeletion` until its dependents are
  gone, then disappears;
- a Terminating namespace has its content deleted, and is removed once empty.

Pods that terminate gracefully (their node's kubelet attached) hold up a Foreground owner or
their namespace until the kubelet confirms, as on a real cluster.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.options import DeleteOptions
from sandbox.patch import PatchType
from sandbox.resources import NAMESPACES, Resource
from sandbox.store import StoredEvent

if TYPE_CHECKING:
    from sandbox.registry import Registry

_FOREGROUND = "foregroundDeletion"


class GarbageCollector:
    """Cascading deletion and namespace termination (see module doc)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._store = registry.store
        self._terminating: set[str] = set()

    def install(self) -> None:
        self._store.add_listener(self._on_event)

    def _on_event(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            self._collect_dependents(event.uid)
            self._release_foreground_owners(event.owners)
            if event.resource.namespaced and event.namespace in self._terminating:
                self._finish_namespace(event.namespace)
        elif event.type == "MODIFIED":
            if event.resource is NAMESPACES:
                self._on_namespace(event)
            elif b'"deletionTimestamp"' in event.raw and _FOREGROUND.encode() in event.raw:
                self._delete_foreground(event)

    # -- owners and dependents ---------------------------------------------------------------

    def _collect_dependents(self, owner_uid: str) -> None:
        for resource, ns, name in self._store.dependents(owner_uid):
            try:
                dependent = self._store.get(resource, ns, name)
            except errors.ApiError:
                continue
            refs = dependent["metadata"].get("ownerReferences") or []
            live = [r for r in refs if self._store.locate_uid(str(r.get("uid"))) is not None]
            if live:
                self._registry.patch(
                    resource, ns, name, {"metadata": {"ownerReferences": live}}, PatchType.MERGE
                )
                continue
            self._delete_quietly(resource, ns, name, DeleteOptions(propagation_policy="Background"))

    def _delete_foreground(self, event: StoredEvent) -> None:
        owner = event.object()
        meta = owner["metadata"]
        if _FOREGROUND not in (meta.get("finalizers") or []) or not meta.get("deletionTimestamp"):
            return
        for resource, ns, name in self._store.dependents(event.uid):
            self._delete_quietly(resource, ns, name, DeleteOptions(propagation_policy="Foreground"))
        self._release_foreground_owners((event.uid,))

    def _release_foreground_owners(self, owner_uids: tuple[str, ...]) -> None:
        for uid in owner_uids:
            found = self._store.locate_uid(uid)
            if found is None or self._store.dependents(uid):
                continue
            resource, ns, name = found
            owner = self._store.get(resource, ns, name)
            finalizers = owner["metadata"].get("finalizers") or []
            if _FOREGROUND in finalizers and owner["metadata"].get("deletionTimestamp"):
                rest = [f for f in finalizers if f != _FOREGROUND]
                self._registry.patch(
                    resource, ns, name, {"metadata": {"finalizers": rest}}, PatchType.MERGE
                )

    def _delete_quietly(
        self, resource: Resource, ns: str, name: str, options: DeleteOptions
    ) -> None:
        try:
            self._registry.delete(resource, ns, name, options)
        except errors.ApiError as error:
            if error.code != 404:
                raise

    # -- namespaces --------------------------------------------------------------------------

    def _on_namespace(self, event: StoredEvent) -> None:
        ns_obj: dict[str, Any] = json.loads(event.raw)
        if (ns_obj.get("status") or {}).get("phase") != "Terminating":
            return
        name = event.name
        if name in self._terminating:
            return
        self._terminating.add(name)
        for resource in self._registry.catalog:
            if not resource.namespaced:
                continue
            for item in self._store.list(resource, name).items():
                self._delete_quietly(
                    resource,
                    name,
                    item["metadata"]["name"],
                    DeleteOptions(propagation_policy="Background"),
                )
        self._finish_namespace(name)

    def _finish_namespace(self, name: str) -> None:
        if name not in self._terminating:
            return
        for resource in self._registry.catalog:
            if resource.namespaced and self._store.count(resource, name):
                return
        self._terminating.discard(name)
        if self._store.exists(NAMESPACES, None, name):
            self._store.delete(NAMESPACES, None, name)
