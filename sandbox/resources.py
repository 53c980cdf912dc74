"""The API resources the emulator serves, described once for storage, routing and discovery.

A `Resource` carries what the real API server knows about a type from its registry: where it
lives (group, version, plural), whether it is namespaced, which subresources it has, which
field labels its list and watch calls accept, and a few strategy switches. Everything else in
the sandbox (store, REST handlers, discovery documents, Table printing) reads these descriptors
rather than special-casing names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

FieldPath = tuple[str, ...]

_READ_VERBS = ("get", "list", "watch")
_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Subresource:
    """A subresource such as `pods/status`; `group`/`version`/`kind` name the body it speaks."""

    name: str
    kind: str
    verbs: tuple[str, ...]
    group: str | None = None
    version: str | None = None


@dataclass(frozen=True, eq=False, repr=False)
class Resource:
    """One served resource type (a group/version/resource in Kubernetes terms).

    Compared and hashed by identity: each type is described once, in this module.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[Subresource, ...] = ()
    verbs: tuple[str, ...] = _ALL_VERBS
    # Field labels beyond metadata.name/metadata.namespace, mapped to the path they read and
    # the value an absent field compares as (the real API converts each to a string).
    field_labels: Mapping[str, tuple[FieldPath, str]] = field(default_factory=dict)
    # Field labels with an equality index, so `spec.nodeName=x` over 100k pods is a lookup.
    indexed_fields: tuple[str, ...] = ()
    # Strategy switches that differ per type in the real registry.
    tracks_generation: bool = False
    returns_deleted_object: bool = False
    default_propagation: str = "Background"
    storage_version_hash: str = ""

    def __repr__(self) -> str:
        return f"Resource({self.qualified}/{self.version})"

    @property
    def api_version(self) -> str:
        """`v1` for the core group, `group/version` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """The group-qualified plural the API uses in messages: `pods`, `jobs.batch`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def path_prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def subresource(self, name: str) -> Subresource | None:
        return next((s for s in self.subresources if s.name == name), None)

    @property
    def has_status(self) -> bool:
        return self.subresource("status") is not None

    def all_field_labels(self) -> Iterator[str]:
        yield "metadata.name"
        if self.namespaced:
            yield "metadata.namespace"
        yield from self.field_labels


def _status(kind: str) -> Subresource:
    return Subresource("status", kind, ("get", "patch", "update"))


def _labels(**paths: tuple[str, str]) -> dict[str, tuple[FieldPath, str]]:
    """Field labels from `label=(dotted.path, default)`; `__` in a keyword stands for `.`."""
    return {
        name.replace("__", "."): (tuple(path.split(".")), default)
        for name, (path, default) in paths.items()
    }


NAMESPACES = Resource(
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    namespaced=False,
    short_names=("ns",),
    subresources=(_status("Namespace"),),
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    field_labels=_labels(status__phase=("status.phase", "")),
    returns_deleted_object=True,
    storage_version_hash="Q3oi5N2YM8M=",
)
NODES = Resource(
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    namespaced=False,
    short_names=("no",),
    subresources=(_status("Node"),),
    field_labels=_labels(spec__unschedulable=("spec.unschedulable", "false")),
    storage_version_hash="XwShjMxG9Fs=",
)
PODS = Resource(
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    namespaced=True,
    short_names=("po",),
    categories=("all",),
    subresources=(
        _status("Pod"),
        Subresource("log", "Pod", ("get",)),
        Subresource("eviction", "Eviction", ("create",), group="policy", version="v1"),
        Subresource("binding", "Binding", ("create",)),
    ),
    field_labels=_labels(
        spec__nodeName=("spec.nodeName", ""),
        spec__restartPolicy=("spec.restartPolicy", ""),
        spec__schedulerName=("spec.schedulerName", ""),
        spec__serviceAccountName=("spec.serviceAccountName", ""),
        spec__hostNetwork=("spec.hostNetwork", "false"),
        status__phase=("status.phase", ""),
        status__podIP=("status.podIP", ""),
        status__nominatedNodeName=("status.nominatedNodeName", ""),
    ),
    indexed_fields=("spec.nodeName",),
    returns_deleted_object=True,
    storage_version_hash="xPOwRZ+Yhw8=",
)
SECRETS = Resource(
    group="",
    version="v1",
    plural="secrets",
    kind="Secret",
    namespaced=True,
    field_labels=_labels(type=("type", "")),
    storage_version_hash="S6u1pOWzb84=",
)
CONFIG_MAPS = Resource(
    group="",
    version="v1",
    plural="configmaps",
    kind="ConfigMap",
    namespaced=True,
    short_names=("cm",),
    storage_version_hash="qFsyl6wFWjQ=",
)
SERVICES = Resource(
    group="",
    version="v1",
    plural="services",
    kind="Service",
    namespaced=True,
    short_names=("svc",),
    categories=("all",),
    subresources=(_status("Service"),),
    storage_version_hash="0/CO1lhkEBI=",
)
SERVICE_ACCOUNTS = Resource(
    group="",
    version="v1",
    plural="serviceaccounts",
    kind="ServiceAccount",
    namespaced=True,
    short_names=("sa",),
    # TokenRequest (`kubectl create token`): a token for the account, never stored.
    subresources=(
        Subresource("token", "TokenRequest", ("create",), "authentication.k8s.io", "v1"),
    ),
    storage_version_hash="pbx9ZvyFpBE=",
)
EVENTS = Resource(
    group="",
    version="v1",
    plural="events",
    kind="Event",
    namespaced=True,
    short_names=("ev",),
    field_labels=_labels(
        involvedObject__kind=("involvedObject.kind", ""),
        involvedObject__namespace=("involvedObject.namespace", ""),
        involvedObject__name=("involvedObject.name", ""),
        involvedObject__uid=("involvedObject.uid", ""),
        involvedObject__apiVersion=("involvedObject.apiVersion", ""),
        involvedObject__resourceVersion=("involvedObject.resourceVersion", ""),
        involvedObject__fieldPath=("involvedObject.fieldPath", ""),
        reason=("reason", ""),
        reportingComponent=("reportingComponent", ""),
        source=("source.component", ""),
        type=("type", ""),
    ),
    storage_version_hash="r2yiGXH7wu8=",
)
DEPLOYMENTS = Resource(
    group="apps",
    version="v1",
    plural="deployments",
    kind="Deployment",
    namespaced=True,
    short_names=("deploy",),
    categories=("all",),
    subresources=(
        _status("Deployment"),
        Subresource("scale", "Scale", ("get", "patch", "update"), "autoscaling", "v1"),
    ),
    tracks_generation=True,
    storage_version_hash="8aSe+NMegvE=",
)
REPLICA_SETS = Resource(
    group="apps",
    version="v1",
    plural="replicasets",
    kind="ReplicaSet",
    namespaced=True,
    short_names=("rs",),
    categories=("all",),
    subresources=(
        _status("ReplicaSet"),
        Subresource("scale", "Scale", ("get", "patch", "update"), "autoscaling", "v1"),
    ),
    tracks_generation=True,
    storage_version_hash="P1RzHs8/mWQ=",
)
DAEMON_SETS = Resource(
    group="apps",
    version="v1",
    plural="daemonsets",
    kind="DaemonSet",
    namespaced=True,
    short_names=("ds",),
    categories=("all",),
    subresources=(_status("DaemonSet"),),
    tracks_generation=True,
    storage_version_hash="dd7pWHUlMKQ=",
)
JOBS = Resource(
    group="batch",
    version="v1",
    plural="jobs",
    kind="Job",
    namespaced=True,
    categories=("all",),
    subresources=(_status("Job"),),
    field_labels=_labels(status__successful=("status.succeeded", "0")),
    tracks_generation=True,
    # batch/v1 keeps its historical default: deleting a Job without a propagation policy
    # orphans its pods (and the API warns about it).
    default_propagation="Orphan",
    storage_version_hash="mudhfqk/qZY=",
)
LEASES = Resource(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    namespaced=True,
    storage_version_hash="gqkMMb/YqFM=",
)
POD_DISRUPTION_BUDGETS = Resource(
    group="policy",
    version="v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    namespaced=True,
    short_names=("pdb",),
    subresources=(_status("PodDisruptionBudget"),),
    tracks_generation=True,
    storage_version_hash="6BGBu0kpHtk=",
)
RBAC_GROUP = "rbac.authorization.k8s.io"


def _rbac(kind: str, plural: str, namespaced: bool, storage_version_hash: str) -> Resource:
    return Resource(
        group=RBAC_GROUP,
        version="v1",
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        storage_version_hash=storage_version_hash,
    )


ROLES = _rbac("Role", "roles", True, "7FuwZcIIItM=")
ROLE_BINDINGS = _rbac("RoleBinding", "rolebindings", True, "eGsCzGH6b1g=")
CLUSTER_ROLES = _rbac("ClusterRole", "clusterroles", False, "bYE5ZWDrJ44=")
CLUSTER_ROLE_BINDINGS = _rbac("ClusterRoleBinding", "clusterrolebindings", False, "48tpQ8gZHFc=")


def _review(group: str, kind: str) -> Resource:
    """What a caller asks about itself (`kubectl auth whoami`, `kubectl auth can-i`):
    created, answered, never stored."""
    return Resource(
        group=group,
        version="v1",
        plural=f"{kind.lower()}s",
        kind=kind,
        namespaced=False,
        verbs=("create",),
    )


SELF_SUBJECT_REVIEWS = _review("authentication.k8s.io", "SelfSubjectReview")
SELF_SUBJECT_ACCESS_REVIEWS = _review("authorization.k8s.io", "SelfSubjectAccessReview")
SELF_SUBJECT_RULES_REVIEWS = _review("authorization.k8s.io", "SelfSubjectRulesReview")

BUILTIN_RESOURCES: tuple[Resource, ...] = (
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    CONFIG_MAPS,
    SERVICES,
    SERVICE_ACCOUNTS,
    EVENTS,
    DEPLOYMENTS,
    REPLICA_SETS,
    DAEMON_SETS,
    JOBS,
    LEASES,
    POD_DISRUPTION_BUDGETS,
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    ROLE_BINDINGS,
    ROLES,
    SELF_SUBJECT_REVIEWS,
    SELF_SUBJECT_ACCESS_REVIEWS,
    SELF_SUBJECT_RULES_REVIEWS,
)


class ResourceCatalog:
    """Looks resources up the ways requests name them: by group/version/plural, by kind."""

    def __init__(self, resources: Iterable[Resource] = BUILTIN_RESOURCES) -> None:
        self._all = tuple(resources)
        self._by_path = {(r.group, r.version, r.plural): r for r in self._all}
        self._by_kind = {(r.group, r.kind): r for r in self._all}

    def __iter__(self) -> Iterator[Resource]:
        return iter(self._all)

    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        return self._by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> Resource | None:
        group = api_version.rpartition("/")[0]
        return self._by_kind.get((group, kind))

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per group, in the order resources were declared."""
        out: dict[str, list[str]] = {}
        for r in self._all:
            versions = out.setdefault(r.group, [])
            if r.version not in versions:
                versions.append(r.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[Resource]:
        return [r for r in self._all if r.group == group and r.version == version]


def read_path(obj: Mapping[str, Any], path: FieldPath) -> Any:
    """The value at `path` in a JSON object, or None where any step is missing."""
    cur: Any = obj
    for step in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(step)
    return cur


def field_string(value: Any, default: str) -> str:
    """A field's value as the API's field selectors compare it."""
    if value is None:
        return default
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def extract_fields(resource: Resource, obj: Mapping[str, Any]) -> dict[str, str]:
    """Every field label of `resource` with its string value in `obj`."""
    meta = obj.get("metadata") or {}
    fields = {"metadata.name": str(meta.get("name", ""))}
    if resource.namespaced:
        fields["metadata.namespace"] = str(meta.get("namespace", ""))
    for label, (path, default) in resource.field_labels.items():
        fields[label] = field_string(read_path(obj, path), default)
    return fields
