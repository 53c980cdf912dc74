"""The bootstrap roles and the clusterrole-aggregation controller of the sandbox's RBAC
(`sandbox.rbac` authorizes with them).

At start the API bootstraps the ClusterRoles every cluster has (`bootstrap`): `cluster-admin`
(bound to the group `system:masters`), the aggregated `admin`, `edit` and `view` (with
`system:aggregate-to-admin|edit|view` holding their rules, for the resources the sandbox
serves), `system:basic-user` (the self-reviews of `reviews`, which are open to every caller
anyway), `system:discovery` and `system:public-info-viewer`. A ClusterRole with an
`aggregationRule` has its `rules` kept as the union of the ClusterRoles its selectors match, as
the clusterrole-aggregation controller keeps them (`install`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.resources import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, RBAC_GROUP
from sandbox.selectors import LabelSelector
from sandbox.store import StoredEvent

if TYPE_CHECKING:
    from sandbox.registry import Registry

BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}


class _Aggregator:
    """Keeps each aggregated ClusterRole's rules the union of the roles its selectors match."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._running = False
        self._dirty = False

    def on_event(self, event: StoredEvent) -> None:
        if event.resource is not CLUSTER_ROLES:
            return
        if self._running:
            self._dirty = True
            return
        self._running = True
        try:
            self._dirty = True
            while self._dirty:
                self._dirty = False
                self._aggregate()
        finally:
            self._running = False

    def _aggregate(self) -> None:
        roles = self._registry.list(CLUSTER_ROLES).items()
        for role in roles:
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if not selectors:
                continue
            parsed = [LabelSelector.from_object(s) for s in selectors]
            rules: list[Any] = []
            for other in roles:
                if other["metadata"]["name"] == role["metadata"]["name"]:
                    continue
                labels = other["metadata"].get("labels") or {}
                if any(s.matches(labels) for s in parsed):
                    rules.extend(r for r in other.get("rules") or () if r not in rules)
            if rules != (role.get("rules") or []):
                try:
                    current = self._registry.get(CLUSTER_ROLES, None, role["metadata"]["name"])
                    current["rules"] = rules
                    self._registry.replace(CLUSTER_ROLES, current)
                except errors.ApiError as error:
                    if error.code not in (404, 409):
                        raise
                    self._dirty = True


def install(registry: Registry) -> None:
    """The aggregation controller and the bootstrap roles (see module doc)."""
    registry.store.add_listener(_Aggregator(registry).on_event)
    bootstrap(registry)


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_VIEW_RULES = [
    _rule(
        [""],
        [
            "configmaps",
            "endpoints",
            "persistentvolumeclaims",
            "persistentvolumeclaims/status",
            "pods",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/status",
        ],
        _READ,
    ),
    _rule(
        [""],
        [
            "bindings",
            "events",
            "limitranges",
            "namespaces/status",
            "pods/log",
            "pods/status",
            "replicationcontrollers/status",
            "resourcequotas",
            "resourcequotas/status",
        ],
        _READ,
    ),
    _rule([""], ["namespaces"], _READ),
    _rule(["discovery.k8s.io"], ["endpointslices"], _READ),
    _rule(
        ["apps"],
        [
            "controllerrevisions",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "statefulsets",
            "statefulsets/scale",
            "statefulsets/status",
        ],
        _READ,
    ),
    _rule(["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"], _READ),
    _rule(["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"], _READ),
    _rule(["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"], _READ),
    _rule(["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"], _READ),
]
_EDIT_RULES = [
    _rule(
        [""],
        ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"],
        _READ,
    ),
    _rule([""], ["serviceaccounts"], ["impersonate"]),
    _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], _WRITE),
    _rule([""], ["pods/eviction"], ["create"]),
    _rule(
        [""],
        [
            "configmaps",
            "events",
            "persistentvolumeclaims",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "secrets",
            "serviceaccounts",
            "services",
            "services/proxy",
        ],
        _WRITE,
    ),
    _rule([""], ["serviceaccounts/token"], ["create"]),
    _rule(
        ["apps"],
        [
            "daemonsets",
            "deployments",
            "deployments/rollback",
            "deployments/scale",
            "replicasets",
            "replicasets/scale",
            "statefulsets",
            "statefulsets/scale",
        ],
        _WRITE,
    ),
    _rule(["autoscaling"], ["horizontalpodautoscalers"], _WRITE),
    _rule(["batch"], ["cronjobs", "jobs"], _WRITE),
    _rule(["policy"], ["poddisruptionbudgets"], _WRITE),
    _rule(["networking.k8s.io"], ["ingresses", "networkpolicies"], _WRITE),
    _rule(["coordination.k8s.io"], ["leases"], [*_READ, *_WRITE]),
]
_ADMIN_RULES = [
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
    _rule([RBAC_GROUP], ["rolebindings", "roles"], [*_WRITE, *_READ]),
]
_DISCOVERY_URLS = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]
_PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _aggregate_label(role: str) -> dict[str, str]:
    return {f"rbac.authorization.k8s.io/aggregate-to-{role}": "true"}


def _cluster_role(
    name: str,
    rules: list[dict[str, Any]] | None,
    *,
    labels: Mapping[str, str] | None = None,
    aggregate: str | None = None,
) -> dict[str, Any]:
    role: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {**BOOTSTRAP_LABELS, **(labels or {})},
            "annotations": dict(_AUTOUPDATE),
        },
        "rules": rules or [],
    }
    if aggregate is not None:
        role["aggregationRule"] = {
            "clusterRoleSelectors": [{"matchLabels": _aggregate_label(aggregate)}]
        }
    return role


def _cluster_binding(name: str, groups: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": dict(BOOTSTRAP_LABELS),
            "annotations": dict(_AUTOUPDATE),
        },
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
    }


BOOTSTRAP_CLUSTER_ROLES = (
    _cluster_role(
        "cluster-admin",
        [
            _rule(["*"], ["*"], ["*"]),
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
    ),
    _cluster_role("admin", None, aggregate="admin"),
    _cluster_role("edit", None, labels=_aggregate_label("admin"), aggregate="edit"),
    _cluster_role("view", None, labels=_aggregate_label("edit"), aggregate="view"),
    _cluster_role("system:aggregate-to-admin", _ADMIN_RULES, labels=_aggregate_label("admin")),
    _cluster_role("system:aggregate-to-edit", _EDIT_RULES, labels=_aggregate_label("edit")),
    _cluster_role("system:aggregate-to-view", _VIEW_RULES, labels=_aggregate_label("view")),
    _cluster_role(
        "system:basic-user",
        [
            _rule(
                ["authorization.k8s.io"],
                ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ["create"],
            ),
            _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"]),
        ],
    ),
    _cluster_role("system:discovery", [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}]),
    _cluster_role(
        "system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_INFO_URLS, "verbs": ["get"]}]
    ),
)
BOOTSTRAP_CLUSTER_ROLE_BINDINGS = (
    _cluster_binding("cluster-admin", ["system:masters"]),
    _cluster_binding("system:basic-user", ["system:authenticated"]),
    _cluster_binding("system:discovery", ["system:authenticated"]),
    _cluster_binding(
        "system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]
    ),
)


def bootstrap(registry: Registry) -> None:
    """Creates the default ClusterRoles and ClusterRoleBindings that are missing."""
    for resource, objects in (
        (CLUSTER_ROLES, BOOTSTRAP_CLUSTER_ROLES),
        (CLUSTER_ROLE_BINDINGS, BOOTSTRAP_CLUSTER_ROLE_BINDINGS),
    ):
        for obj in objects:
            if not registry.store.exists(resource, None, obj["metadata"]["name"]):
                registry.create(resource, json.loads(json.dumps(obj)))
