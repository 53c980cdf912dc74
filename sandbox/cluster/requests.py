"""What a pod asks of a node, and what a node has left: the arithmetic kube-scheduler and the
kubelet's admission share (pure).

A container's request for a resource is its `requests` entry, or its `limits` entry where the
request is absent (the apiserver defaults requests from limits; extended resources such as
`nvidia.com/gpu` may only be given as limits). A pod's request is
`max(init phase, sum(containers) + sum(sidecars)) + overhead`, where the init phase is, for each
regular init container, its request plus the sidecars started before it — the formula of
`k8s.io/component-helpers/resource.PodRequests`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from levers9.core.quantity import parse_quantity

Amounts = dict[str, Fraction]

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
DEFAULT_MAX_PODS = 110  # the kubelet's --max-pods default, which GKE keeps for Standard nodes


def _parse(value: Any) -> Fraction:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        # The apiserver rejects malformed quantities on write; one that slipped through asks
        # for nothing rather than wedging every scheduling cycle.
        return Fraction(0)


def container_requests(container: Mapping[str, Any]) -> Amounts:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    out: Amounts = {str(name): _parse(value) for name, value in limits.items()}
    out.update({str(name): _parse(value) for name, value in requests.items()})
    return out


def add(total: Amounts, more: Mapping[str, Fraction], sign: int = 1) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + sign * value


def _max_into(total: Amounts, other: Mapping[str, Fraction]) -> None:
    for name, value in other.items():
        if value > total.get(name, Fraction(0)):
            total[name] = value


def pod_requests(pod: Mapping[str, Any]) -> Amounts:
    spec = pod.get("spec") or {}
    regular: Amounts = {}
    for container in spec.get("containers") or ():
        add(regular, container_requests(container))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for container in spec.get("initContainers") or ():
        request = container_requests(container)
        if container.get("restartPolicy") == "Always":
            add(sidecars, request)
            _max_into(init_peak, sidecars)
        else:
            during = dict(sidecars)
            add(during, request)
            _max_into(init_peak, during)
    add(regular, sidecars)
    total = dict(regular)
    _max_into(total, init_peak)
    add(total, {k: _parse(v) for k, v in (spec.get("overhead") or {}).items()})
    return {name: value for name, value in total.items() if value}


def parse_amounts(values: Mapping[str, Any]) -> Amounts:
    return {str(name): _parse(value) for name, value in values.items()}


def allocatable(node: Mapping[str, Any]) -> Amounts:
    status = node.get("status") or {}
    source = status.get("allocatable") or status.get("capacity") or {}
    out = {str(name): _parse(value) for name, value in source.items()}
    out.setdefault(PODS, Fraction(DEFAULT_MAX_PODS))
    return out


def insufficient(request: Mapping[str, Fraction], free: Mapping[str, Fraction]) -> list[str]:
    """The resources `request` asks more of than `free` has, in the scheduler's check order:
    pods, cpu, memory, then extended resources by name."""
    names = [n for n in (PODS, CPU, MEMORY) if n in request]
    names += sorted(n for n in request if n not in (PODS, CPU, MEMORY))
    return [n for n in names if request[n] > 0 and request[n] > free.get(n, Fraction(0))]


def in_units(name: str, value: Fraction) -> int:
    """A quantity as the kubelet prints it in admission errors: CPU in millicores, the rest in
    whole units (rounded up, as `Quantity.Value()` rounds)."""
    scaled = value * 1000 if name == CPU else value
    return -((-scaled.numerator) // scaled.denominator)
