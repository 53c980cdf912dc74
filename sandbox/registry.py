"""The API's semantics over the store: what the apiserver's registries do per verb.

Controllers in the sandbox (scheduler, Job and Deployment controllers, kubelets) call this
in-process exactly as the REST layer does, so they see the same defaults, validation,
conflicts and deletion rules as a client over HTTP:

    registry = Registry()                       # owns a Store, PodLogs, the garbage collector
    pod = registry.create(PODS, {...}, namespace="levers9")
    registry.replace(PODS, pod)                  # PUT; 409 on a stale metadata.resourceVersion
    registry.patch(NODES, "", "n1", {"spec": {"unschedulable": True}})   # strategic merge
    registry.replace(PODS, pod, subresource="status")                     # status only
    registry.bind("levers9", "p", "n1")          # pods/binding, what a scheduler posts
    registry.delete(JOBS, "levers9", "j", DeleteOptions(propagation_policy="Background"))
    page = registry.list(PODS, None, field_selector="spec.nodeName=n1")
    async with registry.watch(PODS, "levers9", since=page.resource_version) as w: ...
    detach = registry.attach_kubelet("n1")       # deleting a pod on n1 now waits for its
                                                 # kubelet's grace-0 delete
    registry.service_accounts                    # accounts, pod admission, tokens
                                                 # (`serviceaccounts`)

All calls are synchronous and must run on the event loop's thread (see `store`). Errors are
`ApiError`s with the real API's Status. Deletion follows the apiserver: finalizers and
`propagationPolicy` (Foreground/Background/Orphan; Jobs default to Orphan) are honoured by the
garbage collector (`gc`), namespaces terminate by emptying, and a pod bound to a node whose
kubelet is attached lingers with `deletionTimestamp` until that kubelet confirms; with no
kubelet attached it is removed at once.
"""

from __future__ import annotations

import builtins
import json
import random
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sandbox import decoding, defaults, disruption, errors, subresources
from sandbox.errors import Cause
from sandbox.gc import GarbageCollector
from sandbox.options import DeleteOptions, DeleteOutcome
from sandbox.patch import PatchType, apply_patch
from sandbox.podlogs import PodLogs
from sandbox.resources import (
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    Resource,
    ResourceCatalog,
)
from sandbox.selectors import FieldSelector, LabelSelector
from sandbox.serviceaccounts import ServiceAccounts
from sandbox.store import ListPage, Store, StoredEvent, Watch, dumps, rfc3339
from sandbox.validation import validate, validate_update

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's, without vowels
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_JOB_ORPHAN_WARNING = (
    "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background "
    "to remove them or set propagationPolicy=Orphan to suppress this warning"
)
FOREGROUND_FINALIZER = "foregroundDeletion"


class Registry:
    """Create/read/update/patch/delete with the apiserver's rules (see module doc)."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        catalog: ResourceCatalog | None = None,
        logs: PodLogs | None = None,
        seed: int | None = None,
    ) -> None:
        self.store = store or Store()
        self.catalog = catalog or ResourceCatalog()
        self.logs = logs or PodLogs(now=self.store.now)
        self._kubelets: Counter[str] = Counter()
        self._random = random.Random(seed)
        self.store.add_listener(self._forget_pod_logs)
        GarbageCollector(self).install()
        # Each namespace's `default` account; pods' accounts checked (and, once the API
        # signs tokens, their tokens mounted) at create.
        self.service_accounts = ServiceAccounts(self)
        self.service_accounts.install()
        for name in _SYSTEM_NAMESPACES:
            if not self.store.exists(NAMESPACES, None, name):
                self.create(NAMESPACES, {"metadata": {"name": name}})

    # -- reads -------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return self.store.get(resource, _ns(resource, namespace), name)

    def find(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """`get`, or None where there is no such object (404)."""
        try:
            return self.get(resource, namespace, name)
        except errors.ApiError as error:
            if error.code == 404:
                return None
            raise

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        limit: int = 0,
        continue_token: str | None = None,
    ) -> ListPage:
        labels, fields = self._selectors(resource, label_selector, field_selector)
        return self.store.list(
            resource,
            namespace or None,
            labels=labels,
            fields=fields,
            limit=limit,
            continue_token=continue_token,
        )

    def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        since: str | int | None = None,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
    ) -> Watch:
        labels, fields = self._selectors(resource, label_selector, field_selector)
        return self.store.watch(
            resource,
            namespace or None,
            since=None if since is None else str(since),
            labels=labels,
            fields=fields,
        )

    @staticmethod
    def _selectors(
        resource: Resource,
        label_selector: str | LabelSelector | None,
        field_selector: str | FieldSelector | None,
    ) -> tuple[LabelSelector, FieldSelector]:
        labels = (
            label_selector
            if isinstance(label_selector, LabelSelector)
            else LabelSelector.parse(label_selector)
        )
        fields = (
            field_selector
            if isinstance(field_selector, FieldSelector)
            else FieldSelector.parse(field_selector)
        )
        fields.check_supported(resource.all_field_labels())
        return labels, fields

    # -- create ------------------------------------------------------------------------------

    def create(
        self,
        resource: Resource,
        obj: dict[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """POST: defaults, validation, generateName; 404/403 for a missing/terminating ns."""
        obj = _copy(obj)
        self._check_type(resource, obj)
        decoding.check_body(resource, obj)
        meta = obj.setdefault("metadata", {})
        ns = self._request_namespace(resource, meta, namespace)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        # Admission names an object by its generateName until it has a name.
        requested = str(meta.get("name") or meta.get("generateName") or "")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(resource, ns, str(meta["generateName"]))
        name = str(meta.get("name") or "")
        if resource.namespaced:
            self._check_namespace_open(resource, ns, name)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "creationTimestamp"):
            meta.pop(key, None)
        meta["uid"] = self._uuid()
        if resource.tracks_generation:
            meta["generation"] = 1
        if resource.has_status and resource is not NODES:
            # As the registries' PrepareForCreate: status is the controllers' to write (a
            # node's kubelet registers it with its status, so nodes keep theirs).
            obj.pop("status", None)
        if name:
            defaults.apply_defaults(resource, obj)
            if resource is PODS:
                self.service_accounts.admit_pod(obj, ns, requested)
        causes = validate(resource, obj)
        if causes:
            raise errors.invalid(resource, name, causes)
        if dry_run:
            meta["creationTimestamp"] = rfc3339(self.store.now())
            return obj
        return self.store.create(resource, obj)

    def random_suffix(self, length: int = 5) -> str:
        """Random characters as the apiserver's generated names end with them."""
        return "".join(self._random.choice(_NAME_ALPHABET) for _ in range(length))

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self._random.getrandbits(128), version=4))

    def _generate_name(self, resource: Resource, namespace: str, prefix: str) -> str:
        base = prefix[: 63 - 5] if resource is NAMESPACES else prefix[: 253 - 5]
        for _ in range(8):
            name = base + "".join(self._random.choice(_NAME_ALPHABET) for _ in range(5))
            if not self.store.exists(resource, namespace, name):
                return name
        return name

    def _check_type(self, resource: Resource, obj: dict[str, Any]) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if api_version and api_version != resource.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({resource.api_version})"
            )
        if kind and kind != resource.kind:
            raise errors.bad_request(
                f'{kind} in version "{resource.version}" cannot be handled as a {resource.kind}: '
                f'no kind "{kind}" is registered for version "{resource.api_version}"'
            )
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        # Keep the conventional key order: apiVersion, kind, metadata, then the rest.
        for key in [k for k in obj if k not in ("apiVersion", "kind")]:
            obj[key] = obj.pop(key)

    @staticmethod
    def _request_namespace(resource: Resource, meta: dict[str, Any], namespace: str | None) -> str:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return ""
        ns = namespace or meta.get("namespace") or "default"
        if meta.get("namespace") not in (None, "", ns):
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta["namespace"] = ns
        return str(ns)

    def _check_namespace_open(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            ns_obj = self.store.get(NAMESPACES, None, namespace)
        except errors.ApiError:
            raise errors.not_found(NAMESPACES, namespace) from None
        if (ns_obj.get("status") or {}).get("phase") == "Terminating":
            detail = (
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated"
            )
            error = errors.forbidden(resource, name, detail)
            assert error.details is not None
            error.details["causes"] = [
                {"reason": "NamespaceTerminating", "message": detail, "field": "metadata.namespace"}
            ]
            raise error

    # -- update ------------------------------------------------------------------------------

    def replace(
        self,
        resource: Resource,
        obj: dict[str, Any],
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PUT of the object, or of its `status` / `scale` subresource."""
        meta = obj.get("metadata") or {}
        ns = _ns(resource, namespace if namespace is not None else meta.get("namespace"))
        name = name or str(meta.get("name") or "")
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if subresource == "scale":
            replicas = subresources.replicas_from_scale(obj, name)
            precondition = (obj.get("metadata") or {}).get("resourceVersion")
            updated = self._update(
                resource,
                ns,
                name,
                lambda old: _with_replicas(old, replicas, precondition),
                None,
                dry_run,
            )
            return subresources.scale_of(updated)
        body = _copy(obj)
        if subresource is None:
            decoding.check_body(resource, body)
        return self._update(resource, ns, name, lambda old: body, subresource, dry_run)

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: PatchType = PatchType.STRATEGIC,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PATCH in any of the three formats; a `metadata.resourceVersion` in it is a
        precondition, as with PUT."""
        ns = _ns(resource, namespace)
        if subresource == "scale":

            def mutate_scale(old: dict[str, Any]) -> dict[str, Any]:
                scale = apply_patch(patch_type, subresources.scale_of(old), patch)
                replicas = subresources.replicas_from_scale(scale, name)
                rv = (scale.get("metadata") or {}).get("resourceVersion")
                return _with_replicas(old, replicas, rv)

            return subresources.scale_of(
                self._update(resource, ns, name, mutate_scale, None, dry_run)
            )

        def mutate(old: dict[str, Any]) -> dict[str, Any]:
            patched = apply_patch(patch_type, old, patch)
            decoding.check_patched(resource, patched, patch)
            return patched

        return self._update(resource, ns, name, mutate, subresource, dry_run)

    def _update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], dict[str, Any]],
        subresource: str | None,
        dry_run: bool,
    ) -> dict[str, Any]:
        old = self.store.get(resource, namespace, name)
        new = mutate(_copy(old))
        if not isinstance(new, dict):
            raise errors.bad_request("the body of the request is not an object")
        self._check_type(resource, new)
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        if meta.get("namespace") not in (None, "", namespace) and resource.namespaced:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        if meta.get("name", name) != name:
            raise errors.invalid(
                resource,
                name,
                [
                    Cause(
                        "FieldValueInvalid",
                        f'Invalid value: "{meta.get("name")}": field is immutable',
                        "metadata.name",
                    )
                ],
            )
        requested_rv = meta.get("resourceVersion")
        if requested_rv and str(requested_rv) != old_meta["resourceVersion"]:
            raise errors.conflict(resource, name)
        if subresource == "status":
            new = {**old, "status": new.get("status", {})}
            meta = new["metadata"] = dict(old_meta)
        elif subresource is not None:
            raise errors.path_not_found()
        else:
            if resource.has_status:
                new["status"] = old.get("status", {})
            for key in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if key in old_meta:
                    meta[key] = old_meta[key]
                else:
                    meta.pop(key, None)
            if resource.namespaced:
                meta["namespace"] = namespace
            meta["name"] = name
            defaults.apply_defaults(resource, new)
        causes = validate_update(resource, old, new)
        if causes:
            raise errors.invalid(resource, name, causes)
        if resource.tracks_generation and new.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == old or dry_run:
            return new  # the apiserver skips writes that change nothing
        finishing = meta.get("deletionTimestamp") and not meta.get("finalizers")
        if finishing and (resource is not PODS or self._grace_over(new)):
            # Removing the last finalizer of an object being deleted completes its deletion.
            return self.store.delete(resource, namespace, name)
        return self.store.update(resource, new, expected_rv=int(old_meta["resourceVersion"]))

    # -- delete ------------------------------------------------------------------------------

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        options: DeleteOptions | None = None,
    ) -> DeleteOutcome:
        """DELETE with preconditions, grace, finalizers and dependents' propagation."""
        options = options or DeleteOptions()
        ns = _ns(resource, namespace)
        obj = self.store.get(resource, ns, name)
        meta = obj["metadata"]
        options.check_preconditions(resource, name, meta)
        warnings = []
        policy = options.propagation_policy or resource.default_propagation
        if options.propagation_policy is None and resource.default_propagation == "Orphan":
            warnings.append(_JOB_ORPHAN_WARNING)
        if options.dry_run:
            return DeleteOutcome(obj, finished=False, warnings=warnings)
        if resource is NAMESPACES:
            return DeleteOutcome(self._terminate_namespace(obj), False, warnings)
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        foreground = policy == "Foreground" and self.store.dependents(meta["uid"])
        if foreground and FOREGROUND_FINALIZER not in finalizers:
            finalizers.append(FOREGROUND_FINALIZER)
        grace = self._grace_seconds(resource, obj, options)
        if not finalizers and grace == 0:
            return DeleteOutcome(self.store.delete(resource, ns, name), True, warnings)
        if meta.get("deletionTimestamp") and finalizers == list(meta.get("finalizers") or []):
            current = int(meta.get("deletionGracePeriodSeconds", 0))
            if grace >= current:
                return DeleteOutcome(obj, False, warnings)
        meta["finalizers"] = finalizers
        if not finalizers:
            meta.pop("finalizers")
        meta["deletionTimestamp"] = rfc3339(self.store.now() + timedelta(seconds=grace))
        meta["deletionGracePeriodSeconds"] = grace
        updated = self.store.update(resource, obj, expected_rv=int(meta["resourceVersion"]))
        return DeleteOutcome(updated, False, warnings)

    def delete_collection(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        options: DeleteOptions | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """DELETE on a collection: deletes each match, returns what each delete returned."""
        page = self.list(
            resource, namespace, label_selector=label_selector, field_selector=field_selector
        )
        out = []
        for item in page.items():
            meta = item["metadata"]
            try:
                out.append(
                    self.delete(resource, meta.get("namespace"), meta["name"], options).object
                )
            except errors.ApiError as error:
                if error.code != 404:  # the garbage collector may have been quicker
                    raise
        return out

    def _grace_seconds(
        self, resource: Resource, obj: dict[str, Any], options: DeleteOptions
    ) -> int:
        if resource is not PODS:
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        grace = options.grace_period_seconds
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        node = spec.get("nodeName")
        # Unscheduled and finished pods have nothing to stop; without a kubelet attached to
        # the node nothing would ever confirm, so those go at once as well.
        if not node or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if not self.kubelet_attached(str(node)):
            return 0
        return max(grace, 0)

    def _grace_over(self, pod: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        return int(meta.get("deletionGracePeriodSeconds", 0)) == 0 or not self.kubelet_attached(
            str((pod.get("spec") or {}).get("nodeName", ""))
        )

    def _orphan_dependents(self, owner_uid: str) -> None:
        for resource, ns, name in self.store.dependents(owner_uid):
            dependent = self.store.get(resource, ns, name)
            meta = dependent["metadata"]
            refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != owner_uid]
            if refs:
                meta["ownerReferences"] = refs
            else:
                meta.pop("ownerReferences", None)
            self.store.update(resource, dependent)

    def _terminate_namespace(self, ns_obj: dict[str, Any]) -> dict[str, Any]:
        meta = ns_obj["metadata"]
        if meta.get("deletionTimestamp"):
            return ns_obj
        meta["deletionTimestamp"] = rfc3339(self.store.now())
        meta["deletionGracePeriodSeconds"] = 0
        ns_obj.setdefault("status", {})["phase"] = "Terminating"
        # The namespace lifecycle (gc) reacts to this write: it empties and then removes it.
        return self.store.update(NAMESPACES, ns_obj)

    # -- pods --------------------------------------------------------------------------------

    def bind(self, namespace: str, name: str, node: str) -> dict[str, Any]:
        """pods/binding: assigns an unscheduled pod to `node` (409 if already assigned)."""
        pod = self.store.get(PODS, namespace, name)
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise errors.conflict(PODS, name, f'pod {name} is already assigned to node "{current}"')
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict(
                PODS, name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        pod.setdefault("spec", {})["nodeName"] = node
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(self.store.now()),
            }
        )
        return self.store.update(PODS, pod)

    def evict(self, namespace: str, name: str, eviction: Any) -> None:
        """pods/eviction: deletes the pod with the Eviction's DeleteOptions, unless the one
        PodDisruptionBudget covering it has no disruption left (429, `sandbox.disruption`).

        The budget's status is recomputed from the namespace's pods first and written back,
        so `kubectl get pdb` shows what the eviction was judged by.
        """
        options = subresources.eviction_delete_options(eviction, namespace, name)
        pod = self.store.get(PODS, namespace, name)
        pdbs = self.store.list(POD_DISRUPTION_BUDGETS, namespace).items()
        pdb = disruption.covering(pdbs, pod)
        if pdb is not None and not pod["metadata"].get("deletionTimestamp"):
            pods = self.store.list(PODS, namespace).items()
            budget = disruption.status(pdb, pods)
            try:
                if disruption.may_evict(pdb, budget, pod):
                    budget["disruptionsAllowed"] -= 1
            finally:
                if pdb.get("status") != budget:
                    self.store.update(POD_DISRUPTION_BUDGETS, {**pdb, "status": budget})
        self.delete(PODS, namespace, name, DeleteOptions.from_body(options, {}))

    def attach_kubelet(self, node: str) -> Callable[[], None]:
        """Declares a live kubelet on `node`; returns the function that detaches it.

        While attached, deleting a pod bound to `node` with a grace period only marks it
        terminating; the kubelet stops it and confirms with a grace-0 delete.
        """
        self._kubelets[node] += 1

        def detach() -> None:
            self._kubelets[node] -= 1
            if self._kubelets[node] <= 0:
                del self._kubelets[node]

        return detach

    def kubelet_attached(self, node: str) -> bool:
        return self._kubelets.get(node, 0) > 0

    def _forget_pod_logs(self, event: StoredEvent) -> None:
        if event.type == "DELETED" and event.resource is PODS:
            self.logs.forget(event.namespace, event.name)


def _ns(resource: Resource, namespace: str | None) -> str:
    return (namespace or "") if resource.namespaced else ""


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(dumps(obj))
    return copied


def _with_replicas(obj: dict[str, Any], replicas: int, resource_version: Any) -> dict[str, Any]:
    obj.setdefault("spec", {})["replicas"] = replicas
    if resource_version:
        obj["metadata"]["resourceVersion"] = str(resource_version)
    return obj
