"""Conversions for the subresources whose bodies are not the object itself: scale, eviction,
binding.

`deployments/scale` speaks autoscaling/v1 `Scale` (what `kubectl scale` and HPA use),
`pods/eviction` takes a policy/v1 `Eviction` (what `kubectl drain` posts), `pods/binding` a
core/v1 `Binding` (what a scheduler posts).
"""

from __future__ import annotations

from typing import Any

from sandbox import errors
from sandbox.selectors import LabelSelector


def selector_string(selector: dict[str, Any] | None) -> str:
    """A LabelSelector rendered the way `metav1.LabelSelectorAsSelector(...).String()` does."""
    parts = []
    for req in LabelSelector.from_object(selector).requirements:
        values = sorted(req.values)
        if req.operator == "=":
            parts.append(f"{req.key}={values[0]}")
        elif req.operator in ("in", "notin"):
            parts.append(f"{req.key} {req.operator} ({','.join(values)})")
        elif req.operator == "exists":
            parts.append(req.key)
        elif req.operator == "!":
            parts.append(f"!{req.key}")
    return ",".join(sorted(parts))


def scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale view of a deployment or replica set."""
    meta = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {
            "replicas": int(status.get("replicas", 0)),
            "selector": selector_string(spec.get("selector")),
        },
    }


def replicas_from_scale(scale: Any, name: str) -> int:
    """The replica count a Scale body asks for; 400/422 when it is not a valid Scale."""
    if not isinstance(scale, dict):
        raise errors.bad_request("the body of the request is not a Scale")
    meta = scale.get("metadata") or {}
    if meta.get("name") not in (None, name):
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    replicas = (scale.get("spec") or {}).get("replicas", 0)
    if not isinstance(replicas, int) or replicas < 0:
        raise errors.ApiError(
            422,
            "Invalid",
            f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: {replicas}: '
            "must be greater than or equal to 0",
            {"name": name, "group": "autoscaling", "kind": "Scale"},
        )
    return replicas


def eviction_delete_options(body: Any, namespace: str, name: str) -> dict[str, Any]:
    """The DeleteOptions an Eviction carries, after checking it names the pod in the URL."""
    if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
        raise errors.bad_request("the body of the request is not an Eviction")
    meta = body.get("metadata") or {}
    if meta.get("name", name) != name:
        raise errors.bad_request(
            f"name in URL does not match name in Eviction object: {name}, {meta.get('name')}"
        )
    if meta.get("namespace", namespace) != namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    options = body.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise errors.bad_request("deleteOptions must be an object")
    return options


def binding_target(body: Any, name: str) -> str:
    """The node a Binding assigns the pod to."""
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request is not a Binding")
    meta = body.get("metadata") or {}
    if meta.get("name", name) != name:
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    target = body.get("target") or {}
    node = target.get("name")
    if not node:
        raise errors.ApiError(
            422,
            "Invalid",
            f'Binding "{name}" is invalid: target.name: Required value',
            {"name": name, "kind": "Binding"},
        )
    return str(node)
