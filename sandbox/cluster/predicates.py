"""kube-scheduler's filters for what matters here, and its `FitError` message (pure).

Filters run per node in the default profile's order and stop at the first that fails, as the
framework does: NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector and required
node affinity), NodeResourcesFit. Each failure carries the plugin's reason text and whether
preemption could help (resources) or not (everything else), which shapes the message a
Pending pod shows:

    0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) had untolerated taint
    {nvidia.com/gpu: present}. preemption: 0/4 nodes are available: 1 No preemption victims
    found for incoming pod, 3 Preemption is not helpful for scheduling.

Node conditions reach the scheduler as taints (the node lifecycle controller's
TaintNodesByCondition); they are derived here too, so a NotReady node blocks at once even
before that controller has written its taint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sandbox.cluster.objects import condition, name_of
from sandbox.cluster.requests import Amounts, insufficient

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_BLOCKING = ("NoSchedule", "NoExecute")

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"


@dataclass(frozen=True)
class Failure:
    """Why one node cannot take the pod: the plugin's reasons, and whether evicting lower
    priority pods could change that (`Unschedulable` vs `UnschedulableAndUnresolvable`)."""

    reasons: tuple[str, ...]
    resolvable: bool


def condition_taints(node: Mapping[str, Any]) -> list[dict[str, str]]:
    """The taints the node lifecycle controller keeps in step with conditions and cordon."""
    taints = []
    ready = condition(node, "Ready")
    status = (ready or {}).get("status", "Unknown")
    if status == "False":
        taints += [{"key": NOT_READY_TAINT, "effect": e} for e in _BLOCKING]
    elif status != "True":
        taints += [{"key": UNREACHABLE_TAINT, "effect": e} for e in _BLOCKING]
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    return taints


def effective_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    taints: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
    seen = {(t.get("key"), t.get("effect")) for t in taints}
    taints += [t for t in condition_taints(node) if (t["key"], t["effect"]) not in seen]
    return taints


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """`Toleration.ToleratesTaint`: effect and key must match where given; Exists ignores the
    value, Equal (the default operator) compares it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(
    taints: Iterable[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    effects: Sequence[str] = _BLOCKING,
) -> Mapping[str, Any] | None:
    for taint in taints:
        if taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _expression_matches(expr: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    key = str(expr.get("key", ""))
    operator = expr.get("operator")
    values = [str(v) for v in expr.get("values") or ()]
    have = values_of.get(key)
    if operator == "In":
        return have is not None and have in values
    if operator == "NotIn":
        return have is None or have not in values
    if operator == "Exists":
        return have is not None
    if operator == "DoesNotExist":
        return have is None
    if operator in ("Gt", "Lt") and have is not None and len(values) == 1:
        try:
            left, right = int(have), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term selects no node, as in nodeaffinity.NodeSelector
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not all(_expression_matches(e, labels) for e in expressions):
        return False
    node_fields = {"metadata.name": name_of(node)}
    return all(_expression_matches(f, node_fields) for f in fields)


def matches_node_affinity(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """`spec.nodeSelector` (every label equal) and the required node affinity (any term)."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != str(value):
            return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    ) or None
    if required is None:
        return True
    return any(_term_matches(t, node) for t in required.get("nodeSelectorTerms") or ())


def filter_node(
    pod: Mapping[str, Any], request: Amounts, node: Mapping[str, Any], free: Amounts
) -> Failure | None:
    """The first filter that rejects `node` for `pod` (None when it fits).

    `request` is the pod's request including `pods: 1`; `free` is allocatable minus what the
    pods bound there hold.
    """
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if (node.get("spec") or {}).get("unschedulable") and not any(
        tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tolerations
    ):
        return Failure((REASON_UNSCHEDULABLE,), resolvable=False)
    taint = untolerated_taint(effective_taints(node), tolerations)
    if taint is not None:
        text = f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"
        return Failure((text,), resolvable=False)
    if not matches_node_affinity(pod, node):
        return Failure((REASON_AFFINITY,), resolvable=False)
    short = insufficient(request, free)
    if short:
        reasons = tuple("Too many pods" if n == "pods" else f"Insufficient {n}" for n in short)
        return Failure(reasons, resolvable=True)
    return None


def fit_error(pod: Mapping[str, Any], failures: Sequence[Failure]) -> str:
    """kube-scheduler's message for a pod no node can take (`FitError.Error()` followed by
    the default preemption plugin's post-filter message; this sandbox never preempts)."""
    total = len(failures)
    if total == 0:
        return "no nodes available to schedule pods"
    histogram: Counter[str] = Counter()
    for failure in failures:
        histogram.update(failure.reasons)
    message = f"0/{total} nodes are available: {_join(histogram)}."
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return f"{message} preemption: not eligible due to preemptionPolicy=Never."
    preemption = Counter(_NO_VICTIMS if f.resolvable else _NOT_HELPFUL for f in failures)
    return f"{message} preemption: 0/{total} nodes are available: {_join(preemption)}."


def _join(histogram: Counter[str]) -> str:
    return ", ".join(sorted(f"{count} {reason}" for reason, count in histogram.items()))


def least_allocated_score(request: Amounts, free: Amounts, capacity: Amounts) -> Fraction:
    """NodeResourcesFit's default LeastAllocated score over cpu and memory (0..1, higher is
    emptier after placing the pod)."""
    scores = []
    for name in ("cpu", "memory"):
        cap = capacity.get(name, Fraction(0))
        if cap <= 0:
            continue
        left = free.get(name, Fraction(0)) - request.get(name, Fraction(0))
        scores.append(max(left, Fraction(0)) / cap)
    return sum(scores, Fraction(0)) / len(scores) if scores else Fraction(0)
