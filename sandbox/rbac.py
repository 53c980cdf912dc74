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

The ClusterRoles every cluster has, bootstrapped at start, and the aggregation of `admin`,
`edit` and `view` are `sandbox.rbac_defaults`'s.
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
from sandbox.selectors import FieldSelector
from sandbox.serviceaccounts import ALL_ACCOUNTS_GROUP, AUTHENTICATED_GROUP

if TYPE_CHECKING:
    from sandbox.registry import Registry

Rule = Mapping[str, Any]

GUARDED = (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS)
_WRITES = ("create", "update", "patch")
DISCOVERY_PATHS = ("/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz")


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
