"""Kubernetes RBAC (`rbac.authorization.k8s.io/v1`), enforced for service-account callers.

Roles, ClusterRoles, RoleBindings and ClusterRoleBindings are stored and served like every other
kind (`kubectl apply -f`, `kubectl get clusterroles`, `kubectl create rolebinding`, delete). Who
they govern: callers whose token is a Kubernetes service account's (`Principal.in_cluster`:
a pod's mounted token, `kubectl create token`'s). The sandbox's other users keep their own
model: the admin's static token is a cluster admin, GKE service-account keys are authorized by
IAM roles (`access`).

A request is allowed when a rule of a role bound to the caller matches it, as the RBAC
authorizer matches (`rule_allows`):

- bindings: every ClusterRoleBinding, and the RoleBindings of the request's namespace (a Role
  of that namespace or a ClusterRole, granted in that namespace only); a subject applies when
  it is the `ServiceAccount` (a RoleBinding's subject without `namespace` means its own), the
  `User` `system:serviceaccount:<ns>:<name>`, or a `Group` the caller is in
  (`system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`);
- rules: `verbs` (`*` for all), `apiGroups` (`""` is core, `*`), `resources` (`pods`,
  `pods/log` for a subresource, `*`, `*/scale`), `resourceNames` (when given, the request must
  name one: a get, update, patch or delete, or a list/watch with
  `fieldSelector=metadata.name=<name>`), `nonResourceURLs` (`/healthz`, `/logs/*`) for
  non-resource paths, through ClusterRoleBindings.

Discovery (`/api`, `/apis`, their group and version documents, `/version`, `/openapi/*`,
`/healthz`, `/livez`, `/readyz`) is open to every authenticated caller, as `system:discovery`
and `system:public-info-viewer` make it. Anything else is 403 with the apiserver's message:

    jobs.batch is forbidden: User "system:serviceaccount:levers9:agent" cannot create resource
        "jobs" in API group "batch" in the namespace "gpu"
    pods "p" is forbidden: User "..." cannot get resource "pods/log" in API group "" in the
        namespace "gpu"
    nodes is forbidden: User "..." cannot list resource "nodes" in API group "" at the cluster
        scope
    forbidden: User "..." cannot get path "/metrics"

(a binding whose role is missing adds `: RBAC: clusterrole.rbac.authorization.k8s.io "x" not
found`). Escalation is prevented as Kubernetes prevents it: a service account may write a Role
or ClusterRole only with rules it holds itself where it writes it (or with the `escalate`
verb on it), and a binding only to a role whose rules it holds (or with `bind` on that role);
otherwise 403 `... is attempting to grant RBAC permissions not currently held:` and the rules.
Impersonation (`kubectl --as=system:serviceaccount:levers9:agent`, `--as-group`) is honoured
for the admin, and for service accounts RBAC lets `impersonate` (`RbacAuthorizer.impersonate`):
the request, `kubectl auth can-i` included, is then the impersonated user's.

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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sandbox import errors
from sandbox.auth import Principal
from sandbox.handlers import read_body
from sandbox.patch import PatchType
from sandbox.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    RBAC_GROUP,
    ROLE_BINDINGS,
    ROLES,
    Resource,
)
from sandbox.routing import RequestInfo
from sandbox.selectors import FieldSelector, LabelSelector
from sandbox.serviceaccounts import ALL_ACCOUNTS_GROUP, AUTHENTICATED_GROUP
from sandbox.store import StoredEvent

if TYPE_CHECKING:
    from sandbox.registry import Registry

Rule = Mapping[str, Any]

GUARDED = (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS)
_WRITES = ("create", "update", "patch")
DISCOVERY_PATHS = ("/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz")
BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}


@dataclass(frozen=True)
class Attributes:
    """What RBAC decides on (the apiserver's authorizer.Attributes)."""

    verb: str
    namespace: str = ""
    group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""
    resource_request: bool = True

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(info: RequestInfo, query: Mapping[str, str]) -> Attributes:
    if not info.is_resource_request:
        return Attributes(verb=info.verb, path=info.path, resource_request=False)
    name = info.name or ""
    if not name and info.verb in ("list", "watch"):
        name = _name_from_field_selector(query.get("fieldSelector") or "")
    return Attributes(
        verb=info.verb,
        namespace=info.namespace or "",
        group=info.group,
        resource=info.resource_name,
        subresource=info.subresource or "",
        name=name,
        path=info.path,
    )


def _name_from_field_selector(selector: str) -> str:
    try:
        return FieldSelector.parse(selector).equality("metadata.name") or ""
    except errors.ApiError:
        return ""  # the handler answers the malformed selector


def is_discovery(path: str) -> bool:
    path = path.rstrip("/") or "/"
    return any(path == p or path.startswith(p + "/") for p in DISCOVERY_PATHS)


def _has(values: Any, wanted: str, wildcard: str = "*") -> bool:
    return isinstance(values, list) and (wanted in values or wildcard in values)


def rule_allows(rule: Rule, attrs: Attributes) -> bool:
    """Whether one PolicyRule grants the request (`rbac.RuleAllows`)."""
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return any(_url_matches(url, attrs.path) for url in rule.get("nonResourceURLs") or ())
    if not _has(rule.get("apiGroups"), attrs.group):
        return False
    combined = attrs.full_resource
    resources = rule.get("resources") or ()
    if not any(
        r in ("*", combined) or (attrs.subresource and r == f"*/{attrs.subresource}")
        for r in resources
    ):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _url_matches(rule_url: str, path: str) -> bool:
    if rule_url in ("*", path):
        return True
    return rule_url.endswith("*") and path.startswith(rule_url.rstrip("*"))


def _applies(subject: Mapping[str, Any], principal: Principal, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), str(subject.get("name") or "")
    if kind == "User":
        return name == principal.username
    if kind == "Group":
        return name in principal.groups
    if kind == "ServiceAccount":
        namespace = str(subject.get("namespace") or binding_namespace)
        return bool(namespace) and principal.username == (
            f"system:serviceaccount:{namespace}:{name}"
        )
    return False


def _quoted(values: Iterable[str]) -> str:
    """A Go `%q` of a []string: `["a" "b"]`."""
    return "[" + " ".join(json.dumps(v) for v in values) + "]"


def compact_string(rule: Rule) -> str:
    """`PolicyRule.CompactString`: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`."""
    parts = [
        f"{label}:{_quoted(rule[key])}"
        for key, label in (
            ("apiGroups", "APIGroups"),
            ("resources", "Resources"),
            ("nonResourceURLs", "NonResourceURLs"),
            ("resourceNames", "ResourceNames"),
            ("verbs", "Verbs"),
        )
        if rule.get(key)
    ]
    return "{" + ", ".join(parts) + "}"


def breakdown(rule: Rule) -> list[dict[str, list[str]]]:
    """One rule per group, resource, verb and resource name (`BreakdownRule`)."""
    out: list[dict[str, list[str]]] = []
    verbs = list(rule.get("verbs") or ())
    names = list(rule.get("resourceNames") or ())
    for group in rule.get("apiGroups") or ():
        for resource in rule.get("resources") or ():
            for verb in verbs:
                base = {"apiGroups": [group], "resources": [resource], "verbs": [verb]}
                out.extend(({**base, "resourceNames": [n]} for n in names) if names else [base])
    for url in rule.get("nonResourceURLs") or ():
        out.extend({"nonResourceURLs": [url], "verbs": [verb]} for verb in verbs)
    return out


def _covers(owner: Rule, sub: Mapping[str, list[str]]) -> bool:
    """`ruleCovers` for a broken-down rule."""
    if not _has(owner.get("verbs"), sub["verbs"][0]):
        return False
    if "nonResourceURLs" in sub:
        url = sub["nonResourceURLs"][0]
        return any(
            o == url or o == "*" or (o.endswith("*") and url.startswith(o.rstrip("*")))
            for o in owner.get("nonResourceURLs") or ()
        )
    if not _has(owner.get("apiGroups"), sub["apiGroups"][0]):
        return False
    resource = sub["resources"][0]
    owned = owner.get("resources") or []
    if not (
        "*" in owned
        or resource in owned
        or ("/" in resource and f"*/{resource.split('/', 1)[1]}" in owned)
    ):
        return False
    owner_names = owner.get("resourceNames") or []
    wanted = sub.get("resourceNames") or []
    return not owner_names or (bool(wanted) and set(wanted) <= set(owner_names))


def uncovered(owner_rules: list[Rule], rules: Iterable[Rule]) -> list[str]:
    """The compacted, sorted descriptions of what `rules` grant beyond `owner_rules`."""
    missing = [
        sub
        for rule in rules
        for sub in breakdown(rule)
        if not any(_covers(owner, sub) for owner in owner_rules)
    ]
    simple: dict[tuple[str, str, tuple[str, ...]], dict[str, list[str]]] = {}
    compacted: list[dict[str, list[str]]] = []
    for rule in missing:
        if "nonResourceURLs" in rule:
            compacted.append(rule)
            continue
        key = (rule["apiGroups"][0], rule["resources"][0], tuple(rule.get("resourceNames", ())))
        if key in simple:
            simple[key]["verbs"].extend(rule["verbs"])
        else:
            simple[key] = {k: list(v) for k, v in rule.items()}
            compacted.append(simple[key])
    return sorted({compact_string(rule) for rule in compacted})


class RbacAuthorizer:
    """Decides service-account requests from the registry's RBAC objects (see module doc)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def _bound_rules(
        self, principal: Principal, namespace: str
    ) -> Iterator[tuple[list[Rule], str | None]]:
        """The rules of each role bound to `principal` that apply in `namespace` ("" for
        cluster-scoped requests), with the error of a binding whose role is missing."""
        registry = self._registry
        for binding in registry.list(CLUSTER_ROLE_BINDINGS).items():
            if any(_applies(s, principal, "") for s in binding.get("subjects") or ()):
                yield self._role_rules(binding.get("roleRef") or {}, "")
        if not namespace:
            return
        for binding in registry.list(ROLE_BINDINGS, namespace).items():
            if any(_applies(s, principal, namespace) for s in binding.get("subjects") or ()):
                yield self._role_rules(binding.get("roleRef") or {}, namespace)

    def _role_rules(self, ref: Mapping[str, Any], namespace: str) -> tuple[list[Rule], str | None]:
        kind, name = ref.get("kind"), str(ref.get("name") or "")
        if kind == "ClusterRole":
            resource, ns, singular = CLUSTER_ROLES, None, "clusterrole"
        elif kind == "Role" and namespace:
            resource, ns, singular = ROLES, namespace, "role"
        else:
            return [], f'unsupported role reference kind: "{kind}"'
        try:
            role = self._registry.get(resource, ns, name)
        except errors.ApiError:
            return [], f'{singular}.{RBAC_GROUP} "{name}" not found'
        return list(role.get("rules") or ()), None

    def rules(self, principal: Principal, namespace: str) -> tuple[list[Rule], list[str]]:
        """Every rule `principal` holds in `namespace`, and the resolution errors."""
        rules: list[Rule] = []
        problems: list[str] = []
        for found, problem in self._bound_rules(principal, namespace):
            rules.extend(found)
            if problem:
                problems.append(problem)
        return rules, problems

    def allows(self, principal: Principal, attrs: Attributes) -> tuple[bool, list[str]]:
        if not attrs.resource_request and is_discovery(attrs.path) and attrs.verb == "get":
            return True, []
        problems: list[str] = []
        for found, problem in self._bound_rules(principal, attrs.namespace):
            if any(rule_allows(rule, attrs) for rule in found):
                return True, []
            if problem:
                problems.append(problem)
        return False, problems

    def authorize(self, principal: Principal, info: RequestInfo, query: Mapping[str, str]) -> None:
        """Raises the apiserver's 403 unless RBAC allows the request."""
        attrs = request_attributes(info, query)
        allowed, problems = self.allows(principal, attrs)
        if not allowed:
            raise forbidden(principal, attrs, problems)

    # -- escalation --------------------------------------------------------------------------

    def check_escalation(
        self, principal: Principal, resource: Resource, namespace: str, obj: Mapping[str, Any]
    ) -> None:
        """403 when writing `obj` (a role or binding) would grant `principal` more than it
        holds, as the RBAC registry's escalation checks refuse it."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        ns = namespace if resource.namespaced else ""
        if resource in (ROLES, CLUSTER_ROLES):
            if self._may(principal, "escalate", ns, resource.plural, name):
                return
            self._confirm_no_escalation(principal, resource, ns, name, obj.get("rules") or ())
            if resource is CLUSTER_ROLES and obj.get("aggregationRule"):
                everything = ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},)
                try:
                    self._confirm_no_escalation(principal, resource, ns, name, everything)
                except errors.ApiError:
                    raise errors.forbidden(
                        resource,
                        name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    ) from None
            return
        ref = obj.get("roleRef") or {}
        role_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        if self._may(principal, "bind", ns, role_plural, str(ref.get("name") or "")):
            return
        rules, problem = self._role_rules(ref, ns)
        if problem and problem.endswith("not found"):
            target = CLUSTER_ROLES if ref.get("kind") == "ClusterRole" else ROLES
            raise errors.not_found(target, str(ref.get("name") or ""))
        self._confirm_no_escalation(principal, resource, ns, name, rules)

    def _may(self, principal: Principal, verb: str, namespace: str, plural: str, name: str) -> bool:
        attrs = Attributes(verb, namespace, RBAC_GROUP, plural, name=name)
        return self.allows(principal, attrs)[0]

    def _confirm_no_escalation(
        self,
        principal: Principal,
        resource: Resource,
        namespace: str,
        name: str,
        rules: Iterable[Rule],
    ) -> None:
        owned, problems = self.rules(principal, namespace)
        missing = uncovered(owned, rules)
        if not missing:
            return
        detail = (
            f'user "{principal.username}" (groups={_quoted(principal.groups)}) is attempting to '
            "grant RBAC permissions not currently held:\n" + "\n".join(missing)
        )
        if problems:
            detail += f"; resolution errors: [{' '.join(problems)}]"
        raise errors.forbidden(resource, name, detail)

    def impersonate(self, principal: Principal, headers: Mapping[str, str]) -> Principal:
        """The principal `Impersonate-User` / `Impersonate-Group` ask for (`kubectl --as`,
        `--as-group`), when the caller may impersonate it: the admin may; a service account
        needs the `impersonate` verb on `serviceaccounts` (for `system:serviceaccount:<ns>:
        <name>`), `users` and `groups`; a GKE identity may not. The impersonated user is
        authorized by RBAC, with the groups asked for (a service account's own when none are)
        and `system:authenticated`."""
        name = headers.get("Impersonate-User", "")
        getall = getattr(headers, "getall", None)
        groups = list(getall("Impersonate-Group", ())) if getall else []
        if not name:
            if groups:
                raise errors.ApiError(
                    500,
                    "InternalError",
                    f"Internal error occurred: requested {_quoted(groups)} without "
                    "impersonating a user",
                )
            return principal
        account = name.removeprefix("system:serviceaccount:").split(":")
        wanted = [
            Attributes("impersonate", account[0], "", "serviceaccounts", name=account[1])
            if name.startswith("system:serviceaccount:") and len(account) == 2
            else Attributes("impersonate", "", "", "users", name=name)
        ]
        wanted += [Attributes("impersonate", "", "", "groups", name=g) for g in groups]
        if not principal.superuser:
            for attrs in wanted:
                if not (principal.in_cluster and self.allows(principal, attrs)[0]):
                    raise forbidden(principal, attrs)
        if not groups and len(account) == 2 and name.startswith("system:serviceaccount:"):
            groups = [ALL_ACCOUNTS_GROUP, f"{ALL_ACCOUNTS_GROUP}:{account[0]}"]
        if AUTHENTICATED_GROUP not in groups:
            groups.append(AUTHENTICATED_GROUP)
        return Principal(name, groups=tuple(groups), in_cluster=True)

    async def check_write(
        self, principal: Principal, info: RequestInfo, request: web.Request
    ) -> None:
        """`check_escalation` for a create, update or patch of a role or binding."""
        resource = info.resource
        if resource not in GUARDED or info.verb not in _WRITES or info.subresource:
            return
        assert resource is not None
        namespace = info.namespace or ""
        if info.verb == "patch":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            try:
                patch_type = PatchType(content_type)
                patch = json.loads(await request.read() or b"null")
                obj = self._registry.patch(
                    resource, namespace, info.name or "", patch, patch_type, dry_run=True
                )
            except (ValueError, errors.ApiError):
                return  # the handler answers what is wrong with the request
        else:
            body = await read_body(request)
            if not isinstance(body, dict):
                return
            obj = body
            if info.name and not (obj.get("metadata") or {}).get("name"):
                obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "name": info.name}}
        self.check_escalation(principal, resource, namespace, obj)


def forbidden(
    principal: Principal, attrs: Attributes, problems: Iterable[str] = ()
) -> errors.ApiError:
    """The apiserver's 403 for a request its authorizer denied."""
    user = principal.username
    problems = list(problems)
    if not attrs.resource_request:
        detail = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        scope = (
            f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        )
        detail = (
            f'User "{user}" cannot {attrs.verb} resource "{attrs.full_resource}" in API group '
            f'"{attrs.group}" {scope}'
        )
    if problems:
        listed = problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]"
        detail += f": RBAC: {listed}"
    if not attrs.resource_request:
        return errors.ApiError(403, "Forbidden", f"forbidden: {detail}", {})
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    details: dict[str, Any] = {}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.group:
        details["group"] = attrs.group
    details["kind"] = attrs.resource
    return errors.ApiError(403, "Forbidden", f"{subject} is forbidden: {detail}", details)


# -- the clusterrole-aggregation controller and the bootstrap roles ---------------------------


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
