"""Reading and shaping the API objects the controllers pass around (pure, JSON dicts).

Controllers read pods, nodes, Jobs and Deployments as the API returns them and write back
the same shapes; these helpers hold the conventions they share: terminal phases, controller
references, conditions and their timestamps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandbox.resources import Resource

Obj = dict[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GPU = "nvidia.com/gpu"


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = obj.get("metadata") or {}
    return found


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name", ""))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace", ""))


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid", ""))


def phase_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def node_name_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return phase_of(pod) in TERMINAL_PHASES


def is_terminating(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def is_active(pod: Mapping[str, Any]) -> bool:
    """Neither finished nor on its way out: what Job and ReplicaSet controllers count."""
    return not is_terminal(pod) and not is_terminating(pod)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in meta(obj).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owner_reference(resource: Resource, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference a Job, ReplicaSet or Deployment stamps on what it creates."""
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            found: dict[str, Any] = cond
            return found
    return None


def condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    now: str,
    *,
    reason: str | None = None,
    message: str | None = None,
    time_fields: Sequence[str] = ("lastProbeTime",),
) -> bool:
    """Sets one condition in place; returns whether anything a reader sees changed.

    `lastTransitionTime` moves only when the status flips, as every controller does it;
    `time_fields` are the per-type extra stamps (`lastProbeTime` null for pods and Jobs,
    `lastUpdateTime` for Deployments, `lastHeartbeatTime` for nodes), refreshed on change.
    """
    for cond in conditions:
        if cond.get("type") != kind:
            continue
        same = (
            cond.get("status") == status
            and cond.get("reason") == reason
            and cond.get("message") == message
        )
        if same:
            return False
        if cond.get("status") != status:
            cond["lastTransitionTime"] = now
        cond["status"] = status
        _set_optional(cond, "reason", reason)
        _set_optional(cond, "message", message)
        for name in time_fields:
            cond[name] = None if name == "lastProbeTime" else now
        return True
    cond = {"type": kind, "status": status}
    for name in time_fields:
        cond[name] = None if name == "lastProbeTime" else now
    cond["lastTransitionTime"] = now
    _set_optional(cond, "reason", reason)
    _set_optional(cond, "message", message)
    conditions.append(cond)
    return True


def _set_optional(target: dict[str, Any], key: str, value: str | None) -> None:
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value


def node_address(node: Mapping[str, Any], kind: str) -> str | None:
    for address in (node.get("status") or {}).get("addresses") or ():
        if address.get("type") == kind:
            return str(address.get("address"))
    return None
