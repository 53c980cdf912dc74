"""Request attributes from a URL and method, as the apiserver's `RequestInfoFactory` derives them.

Authorization, fault injection, request counting and the handlers all look at one
`RequestInfo`: the Kubernetes verb (`list` vs `get`, `watch`, `deletecollection`), the resource
and subresource, the namespace and name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sandbox.resources import Resource, ResourceCatalog

_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class RequestInfo:
    """What a request is about. `resource` is None for non-resource paths and unknown types."""

    verb: str
    path: str
    is_resource_request: bool = False
    group: str = ""
    version: str = ""
    resource_name: str = ""
    resource: Resource | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @property
    def full_resource(self) -> str:
        """`pods` or `pods/log`, as RBAC names what is asked for."""
        if self.subresource:
            return f"{self.resource_name}/{self.subresource}"
        return self.resource_name


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def resolve(
    catalog: ResourceCatalog, method: str, path: str, query: Mapping[str, str]
) -> RequestInfo:
    """Classifies a request; paths outside /api and /apis are non-resource requests."""
    parts = [p for p in path.split("/") if p]
    method = method.upper()
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestInfo(verb=method.lower(), path=path)
    if not rest:
        return RequestInfo(verb=method.lower(), path=path)
    watch_path = rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace: str | None = None
    if len(rest) >= 2 and rest[0] == "namespaces":
        if len(rest) == 2 or rest[2] in _NAMESPACE_SUBRESOURCES:
            namespace = rest[1]
        else:
            namespace, rest = rest[1], rest[2:]
    if not rest:
        return RequestInfo(verb=method.lower(), path=path)
    resource_name = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    verb = {
        "GET": "get",
        "HEAD": "get",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }.get(method, method.lower())
    if verb == "get" and name is None:
        verb = "list"
    if verb == "delete" and name is None:
        verb = "deletecollection"
    if watch_path or (verb in ("get", "list") and _truthy(query.get("watch"))):
        verb = "watch"
    return RequestInfo(
        verb=verb,
        path=path,
        is_resource_request=True,
        group=group,
        version=version,
        resource_name=resource_name,
        resource=catalog.lookup(group, version, resource_name),
        namespace=namespace,
        name=name,
        subresource=subresource,
    )
