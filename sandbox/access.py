"""What a caller may do: GKE's master authorized networks and IAM roles on Kubernetes calls.

Network. GKE drops packets from addresses outside the cluster's authorized networks: the
client sees a connection timeout, never an HTTP answer. Everything here is loopback, so the
emulator takes the caller's address from the scenario (`egress_ip`, the controlplane's egress
IP) instead of the TCP peer, and answers a call from outside the networks in one of two ways,
chosen by `network_denial`:

- `"forbidden"` (default): 403 Forbidden whose message says the egress IP is not in the master
  authorized networks. Fast and self-explanatory, for tests and `levers9 dev`.
- `"timeout"`: the request is held unanswered for `timeout_hold_seconds` and the connection is
  then dropped, so clients see their own timeout, as against GKE.

The admin user's calls (the person at the laptop, with kubectl) come from the workstation's
address (`workstation_ip`), checked like any other. Kubernetes service accounts (a pod's
in-cluster config, `Principal.in_cluster`) reach the API from inside the cluster, which the
authorized networks do not filter: they are never refused here, and RBAC (`rbac`), not IAM,
authorizes them. `authorized_networks=None` means the feature is off (every address may
connect).

IAM. A service account may call the API only with a role that grants the permission GKE maps
the request to (`container.<resource>.<verb>`: `container.pods.list`, `container.jobs.create`,
`container.pods.getLogs`, `container.deployments.updateScale` ...). Otherwise: 403 with GKE's
text, e.g. `pods is forbidden: User "..." cannot list resource "pods" in API group "" at the
cluster scope: requires one of ["container.pods.list"] permission(s).` Discovery paths
(`/api`, `/apis`, `/version`) are open to any authenticated caller, as RBAC's
`system:discovery` makes them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from sandbox import errors
from sandbox.auth import Principal
from sandbox.routing import RequestInfo

NetworkDenial = Literal["forbidden", "timeout"]
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEVELOPER = "roles/container.developer"
_READ_VERBS = frozenset({"get", "list", "getStatus", "getScale", "getLogs"})
_IAM_RESOURCE = {
    "configmaps": "configMaps",
    "daemonsets": "daemonSets",
    "replicasets": "replicaSets",
    "serviceaccounts": "serviceAccounts",
    "clusterroles": "clusterRoles",
    "clusterrolebindings": "clusterRoleBindings",
    "rolebindings": "roleBindings",
}


def iam_permission(info: RequestInfo) -> str:
    """The IAM permission GKE checks for a resource request."""
    verb = {
        "get": "get",
        "list": "list",
        "watch": "list",
        "create": "create",
        "update": "update",
        "patch": "update",
        "delete": "delete",
        "deletecollection": "delete",
    }.get(info.verb, info.verb)
    resource = _IAM_RESOURCE.get(info.resource_name, info.resource_name)
    reading = info.verb in ("get", "list", "watch")
    match info.subresource:
        case "status":
            verb = "getStatus" if reading else "updateStatus"
        case "scale":
            verb = "getScale" if reading else "updateScale"
        case "log":
            verb = "getLogs"
        case "eviction":
            verb = "evict"
        case "binding":
            resource, verb = "bindings", "create"
        case "token":
            verb = "createToken"
    return f"container.{resource}.{verb}"


def _role_grants(role: str, permission: str) -> bool:
    _, resource, verb = permission.split(".", 2)
    if role in ("roles/container.admin", DEVELOPER, "roles/owner", "roles/editor"):
        return True
    if role in ("roles/container.viewer", "roles/viewer"):
        return verb in _READ_VERBS and resource != "secrets"
    return False


@dataclass
class AccessPolicy:
    """The scenario's IAM bindings and network settings; changed at runtime via /_sandbox."""

    role_bindings: dict[str, set[str]] = field(default_factory=dict)
    authorized_networks: list[IpNetwork] | None = None
    egress_ip: str = "203.0.113.10"
    workstation_ip: str = "127.0.9.9"
    """Where the admin's calls (kubectl at the operator's desk) come from: inside the default
    scenario's authorized networks, and shut out, as on GKE, by networks that leave it out."""
    network_denial: NetworkDenial = "forbidden"
    timeout_hold_seconds: float = 30.0

    def grant(self, email: str, role: str = DEVELOPER) -> None:
        self.role_bindings.setdefault(email, set()).add(role)

    def revoke(self, email: str, role: str | None = None) -> None:
        if role is None:
            self.role_bindings.pop(email, None)
        else:
            self.role_bindings.get(email, set()).discard(role)

    def set_authorized_networks(self, cidrs: Iterable[str] | None) -> None:
        self.authorized_networks = (
            None if cidrs is None else [ipaddress.ip_network(c, strict=False) for c in cidrs]
        )

    def source(self, principal: Principal | None) -> str:
        """The address a caller's requests come from."""
        return (
            self.workstation_ip
            if principal is not None and principal.network_exempt
            else (self.egress_ip)
        )

    def network_allows(self, principal: Principal | None) -> bool:
        if self.authorized_networks is None or (principal is not None and principal.in_cluster):
            return True
        address = ipaddress.ip_address(self.source(principal))
        return any(address in network for network in self.authorized_networks)

    def network_error(self, principal: Principal | None = None) -> errors.ApiError:
        networks = ", ".join(str(n) for n in self.authorized_networks or []) or "none"
        return errors.ApiError(
            403,
            "Forbidden",
            f"Forbidden: the request came from {self.source(principal)}, which is not in the"
            f" cluster's master authorized networks ({networks}); GKE would not answer this"
            " connection",
            {},
        )

    def authorize(self, principal: Principal, info: RequestInfo) -> None:
        """Raises the 403 GKE gives when `principal` lacks the permission for `info`."""
        if principal.superuser or not info.is_resource_request:
            return
        permission = iam_permission(info)
        roles = self.role_bindings.get(principal.email or "", set())
        if any(_role_grants(role, permission) for role in roles):
            return
        raise forbidden(principal, info, permission)

    def describe(self) -> dict[str, Any]:
        return {
            "egressIp": self.egress_ip,
            "workstationIp": self.workstation_ip,
            "authorizedNetworks": None
            if self.authorized_networks is None
            else [str(n) for n in self.authorized_networks],
            "networkDenial": self.network_denial,
            "timeoutHoldSeconds": self.timeout_hold_seconds,
            "roleBindings": {k: sorted(v) for k, v in sorted(self.role_bindings.items())},
        }

    def update(self, changes: dict[str, Any]) -> None:
        """Applies the fields present in `changes` (the shape `describe` returns)."""
        if "egressIp" in changes:
            ipaddress.ip_address(changes["egressIp"])
            self.egress_ip = str(changes["egressIp"])
        if "workstationIp" in changes:
            ipaddress.ip_address(changes["workstationIp"])
            self.workstation_ip = str(changes["workstationIp"])
        if "authorizedNetworks" in changes:
            self.set_authorized_networks(changes["authorizedNetworks"])
        if "networkDenial" in changes:
            if changes["networkDenial"] not in ("forbidden", "timeout"):
                raise ValueError("networkDenial must be 'forbidden' or 'timeout'")
            self.network_denial = changes["networkDenial"]
        if "timeoutHoldSeconds" in changes:
            self.timeout_hold_seconds = float(changes["timeoutHoldSeconds"])
        if "roleBindings" in changes:
            self.role_bindings = {k: set(v) for k, v in changes["roleBindings"].items()}


def forbidden(principal: Principal, info: RequestInfo, permission: str) -> errors.ApiError:
    group = info.resource.group if info.resource is not None else info.group
    qualified = f"{info.resource_name}.{group}" if group else info.resource_name
    subject = f'{qualified} "{info.name}"' if info.name else qualified
    scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{principal.username}" cannot {info.verb} resource '
        f'"{info.full_resource}" in API group "{group}" {scope}: requires one of '
        f'["{permission}"] permission(s).'
    )
    details: dict[str, Any] = {}
    if info.name:
        details["name"] = info.name
    if group:
        details["group"] = group
    details["kind"] = info.resource_name
    return errors.ApiError(403, "Forbidden", message, details)
