"""PodDisruptionBudgets on the eviction subresource, through the real kubectl: a drain evicts
what the budget allows and is refused the rest (429 with the DisruptionBudget cause) until the
budget changes; the budget's status is computed from the pods it selects; a pod two budgets
cover is a 500; a terminal pod is evicted whatever the budget says."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import ApiError
from sandbox.resources import POD_DISRUPTION_BUDGETS, PODS
from sandbox.server import Sandbox
from tests.sandbox.factories import seed_node, seed_pod, unique
from tests.waiting import until

Call = Callable[..., Any]
Kubectl = Callable[..., str]
EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction"}


@pytest.fixture
def node(sandbox: Sandbox, sandbox_call: Call) -> str:
    name = unique("gpu")
    sandbox_call(seed_node, sandbox.registry, name)
    return name


def _ready_pod(sandbox: Sandbox, namespace: str, name: str, node: str, app: str) -> None:
    seed_pod(sandbox.registry, namespace, name, node=node, labels={"app": app}, phase="Running")
    pod = sandbox.registry.get(PODS, namespace, name)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    sandbox.registry.replace(PODS, pod, subresource="status")


def _pdb(kubectl: Kubectl, tmp_path: Path, namespace: str, name: str, spec: dict[str, Any]) -> None:
    manifest = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    kubectl("apply", "-f", str(path))


def _status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl("-n", namespace, "get", "pdb", name, "-o", "json")
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def test_drain_evicts_what_the_budget_allows_and_is_refused_the_rest(
    kubectl: Kubectl,
    sandbox: Sandbox,
    sandbox_call: Call,
    namespace: str,
    node: str,
    tmp_path: Path,
) -> None:
    for name in ("model-0", "model-1"):
        sandbox_call(_ready_pod, sandbox, namespace, name, node, "model")
    _pdb(
        kubectl,
        tmp_path,
        namespace,
        "model",
        {"minAvailable": 1, "selector": {"matchLabels": {"app": "model"}}},
    )
    err = kubectl("drain", node, "--ignore-daemonsets", "--force", "--timeout=3s", ok=False)
    assert "Cannot evict pod as it would violate the pod's disruption budget." in err
    assert len(kubectl("-n", namespace, "get", "pods", "-o", "name").split()) == 1
    status = _status(kubectl, namespace, "model")
    assert (status["currentHealthy"], status["desiredHealthy"]) == (1, 1)
    assert (status["disruptionsAllowed"], status["expectedPods"]) == (0, 1)


def test_the_refusal_names_the_budget_as_the_apiserver_does(
    sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    sandbox_call(_ready_pod, sandbox, namespace, "p", node, "solo")
    sandbox_call(
        sandbox.registry.create,
        POD_DISRUPTION_BUDGETS,
        {
            "metadata": {"name": "solo"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "solo"}}},
        },
        namespace=namespace,
    )
    with pytest.raises(ApiError) as refused:
        sandbox_call(sandbox.registry.evict, namespace, "p", dict(EVICTION))
    assert refused.value.code == 429
    assert refused.value.details == {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget solo needs 1 healthy pods and has 1 currently",
            }
        ]
    }
    assert sandbox_call(sandbox.store.exists, PODS, namespace, "p")


def test_a_drain_waits_for_the_budget_then_completes(
    kubectl: Kubectl,
    sandbox: Sandbox,
    sandbox_call: Call,
    namespace: str,
    node: str,
    tmp_path: Path,
) -> None:
    sandbox_call(_ready_pod, sandbox, namespace, "agent", node, "agent")
    spec: dict[str, Any] = {"minAvailable": 1, "selector": {"matchLabels": {"app": "agent"}}}
    _pdb(kubectl, tmp_path, namespace, "agent", spec)
    drained: list[str] = []
    drain = threading.Thread(
        target=lambda: drained.append(
            kubectl("drain", node, "--ignore-daemonsets", "--force", "--timeout=60s")
        )
    )
    drain.start()
    # Proof the drain was refused: the eviction wrote the budget's status, pod still there.
    until(
        lambda: "disruptionsAllowed" in _status(kubectl, namespace, "agent") or None,
        30,
        what="the drain's first eviction refused",
    )
    assert kubectl("-n", namespace, "get", "pods", "-o", "name").split() == ["pod/agent"]
    _pdb(kubectl, tmp_path, namespace, "agent", {**spec, "minAvailable": 0})
    drain.join(60)
    assert drained
    assert f"node/{node} drained" in drained[0]
    assert kubectl("-n", namespace, "get", "pods", "-o", "name").split() == []


def test_two_budgets_are_a_500_and_a_terminal_pod_goes_anyway(
    sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    sandbox_call(_ready_pod, sandbox, namespace, "p", node, "twice")
    for name in ("a", "b"):
        sandbox_call(
            sandbox.registry.create,
            POD_DISRUPTION_BUDGETS,
            {
                "metadata": {"name": name},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "twice"}}},
            },
            namespace=namespace,
        )
    with pytest.raises(ApiError) as refused:
        sandbox_call(sandbox.registry.evict, namespace, "p", dict(EVICTION))
    assert refused.value.code == 500
    assert "more than one PodDisruptionBudget" in refused.value.message
    sandbox_call(sandbox.registry.delete, POD_DISRUPTION_BUDGETS, namespace, "b")
    pod = sandbox_call(sandbox.registry.get, PODS, namespace, "p")
    pod["status"]["phase"] = "Succeeded"
    sandbox_call(sandbox.registry.replace, PODS, pod, subresource="status")
    sandbox_call(sandbox.registry.evict, namespace, "p", dict(EVICTION))
    assert not sandbox_call(sandbox.store.exists, PODS, namespace, "p")


@pytest.mark.parametrize(("policy", "evicted"), [("AlwaysAllow", True), (None, False)])
def test_an_unready_pod_goes_when_the_policy_lets_it(
    sandbox: Sandbox,
    sandbox_call: Call,
    namespace: str,
    node: str,
    policy: str | None,
    evicted: bool,
) -> None:
    app = unique("unready")
    sandbox_call(_ready_pod, sandbox, namespace, "ready", node, app)
    sandbox_call(
        seed_pod, sandbox.registry, namespace, "starting", node=node, labels={"app": app},
        phase="Running",
    )  # fmt: skip
    spec: dict[str, Any] = {"minAvailable": 2, "selector": {"matchLabels": {"app": app}}}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    sandbox_call(
        sandbox.registry.create,
        POD_DISRUPTION_BUDGETS,
        {"metadata": {"name": app}, "spec": spec},
        namespace=namespace,
    )
    # The budget is not met (1 healthy of 2 desired): only AlwaysAllow lets the unready one go.
    if evicted:
        sandbox_call(sandbox.registry.evict, namespace, "starting", dict(EVICTION))
    else:
        with pytest.raises(ApiError) as refused:
            sandbox_call(sandbox.registry.evict, namespace, "starting", dict(EVICTION))
        assert refused.value.code == 429
    assert sandbox_call(sandbox.store.exists, PODS, namespace, "starting") is not evicted
