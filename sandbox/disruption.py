"""PodDisruptionBudgets as the apiserver's eviction subresource reads them (policy/v1).

A PDB selects pods of its namespace (a PDB whose selector is empty selects none, as in the
eviction REST storage). Its status is computed here from the pods it selects, the way the
disruption controller writes it: `currentHealthy` counts the selected pods that are Ready and not
being deleted, `desiredHealthy` is `minAvailable` (an integer, or a percentage of the selected
pods rounded up) or the selected pods less `maxUnavailable`, and `disruptionsAllowed` is how many
more may go. An eviction of a pod that one PDB covers is refused with 429 TooManyRequests and a
`DisruptionBudget` cause while `disruptionsAllowed` is 0, so `kubectl drain` waits and retries; a
pod that two PDBs cover is a 500, as upstream. A terminal pod is always evicted; a pod that is not
Ready is evicted when the budget is met (`unhealthyPodEvictionPolicy: IfHealthyBudget`, the
default) or always (`AlwaysAllow`). Simplification: the selected pods stand in for the
controller's scale when `maxUnavailable` or a percentage is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sandbox import errors
from sandbox.selectors import LabelSelector

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    selector = LabelSelector.from_object((pdb.get("spec") or {}).get("selector"))
    if selector.empty:
        return False
    return selector.matches((pod.get("metadata") or {}).get("labels") or {})


def healthy(pod: Mapping[str, Any]) -> bool:
    """Ready and not being deleted: what the disruption controller counts."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _scaled(value: Any, expected: int, field: str) -> int:
    """An IntOrString of the PDB's spec as a count of `expected` pods (percentages round up)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return math.ceil(int(value[:-1]) * expected / 100)
    raise errors.unprocessable(f"spec.{field}: {value!r} is neither an integer nor a percentage")


def status(pdb: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The PDB's status from the pods of its namespace."""
    selected = [p for p in pods if selects(pdb, p)]
    expected = len(selected)
    spec = pdb.get("spec") or {}
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected, "minAvailable")
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, "maxUnavailable"))
    else:
        desired = 1  # neither: policy/v1beta1's default, minAvailable 1
    current = sum(1 for p in selected if healthy(p))
    meta = pdb.get("metadata") or {}
    return {
        "observedGeneration": meta.get("generation", 1),
        "disruptionsAllowed": max(0, current - desired),
        "currentHealthy": current,
        "desiredHealthy": desired,
        "expectedPods": expected,
    }


def covering(pdbs: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The one PDB that covers `pod`, None when none does; 500 when several do."""
    found = [pdb for pdb in pdbs if selects(pdb, pod)]
    if len(found) > 1:
        raise errors.ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support.",
        )
    return found[0] if found else None


def may_evict(pdb: Mapping[str, Any], budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether evicting `pod` spends the budget (True) or leaves it alone (False: the pod is
    terminal, or unhealthy and the policy lets it go); raises the 429 when the budget is spent."""
    if terminal(pod):
        return False
    if not healthy(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        if policy == "AlwaysAllow" or budget["currentHealthy"] >= budget["desiredHealthy"] > 0:
            return False
    if budget["disruptionsAllowed"] <= 0:
        name = (pdb.get("metadata") or {}).get("name", "")
        raise errors.ApiError(
            429,
            "TooManyRequests",
            VIOLATION,
            {
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {name} needs "
                        f"{budget['desiredHealthy']} healthy pods and has "
                        f"{budget['currentHealthy']} currently",
                    }
                ]
            },
        )
    return True
