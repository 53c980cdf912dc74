"""API semantics in-process: defaults, validation (422), generateName, status vs spec,
generation, no-op updates, scale, binding and eviction, graceful pod deletion with a kubelet
attached, delete preconditions (409), garbage collection by propagation policy, and namespace
termination."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import errors
from sandbox.options import DeleteOptions
from sandbox.patch import PatchType
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, JOBS, NAMESPACES, NODES, PODS, SECRETS
from tests.sandbox.factories import (
    deployment_manifest,
    job_manifest,
    pod_manifest,
    seed_node,
    seed_pod,
)

NS = "levers9"


@pytest.fixture
def registry() -> Registry:
    registry = Registry()
    registry.create(NAMESPACES, {"metadata": {"name": NS}})
    return registry


def owned_by(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_system_namespaces_exist() -> None:
    names = {o["metadata"]["name"] for o in Registry().list(NAMESPACES).items()}
    assert names == {"default", "kube-system", "kube-public", "kube-node-lease"}


def test_pod_defaults(registry: Registry) -> None:
    created = registry.create(PODS, pod_manifest("p"), namespace=NS)
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    spec = created["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["serviceAccountName"] == "default"
    assert {t["key"] for t in spec["tolerations"]} == {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
    assert spec["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_job_defaults_select_its_own_pods(registry: Registry) -> None:
    job = registry.create(JOBS, job_manifest("j"), namespace=NS)
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert job["spec"]["template"]["metadata"]["labels"]["job-name"] == "j"
    assert (job["spec"]["completions"], job["spec"]["backoffLimit"]) == (1, 6)
    assert job["metadata"]["generation"] == 1


def test_generate_name(registry: Registry) -> None:
    created = registry.create(
        PODS, {**pod_manifest(""), "metadata": {"generateName": "w-"}}, namespace=NS
    )
    name = created["metadata"]["name"]
    assert name.startswith("w-")
    assert len(name) == len("w-") + 5


@pytest.mark.parametrize(
    ("manifest", "field", "message"),
    [
        (pod_manifest("Bad_Name"), "metadata.name", "a lowercase RFC 1123 subdomain"),
        (
            {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            "metadata.name",
            "Required value: name or generateName is required",
        ),
        (
            {"metadata": {"name": "p"}, "spec": {"containers": []}},
            "spec.containers",
            "Required value",
        ),
        (
            {
                "metadata": {"name": "p", "labels": {"a": "b c"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
            "metadata.labels",
            "a valid label",
        ),
    ],
)
def test_invalid_objects(
    registry: Registry, manifest: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(errors.ApiError) as caught:
        registry.create(PODS, manifest, namespace=NS)
    status = caught.value.status()
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["details"]["kind"] == "Pod"
    assert any(c["field"] == field and message in c["message"] for c in status["details"]["causes"])


def test_job_restart_policy_must_be_never_or_on_failure(registry: Registry) -> None:
    manifest = job_manifest("j")
    manifest["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(errors.ApiError) as caught:
        registry.create(JOBS, manifest, namespace=NS)
    assert 'Unsupported value: "Always"' in caught.value.message
    assert caught.value.details is not None
    assert caught.value.details["group"] == "batch"


def test_missing_and_terminating_namespaces(registry: Registry) -> None:
    with pytest.raises(errors.ApiError) as missing:
        registry.create(PODS, pod_manifest("p"), namespace="nowhere")
    assert missing.value.message == 'namespaces "nowhere" not found'
    registry.create(NAMESPACES, {"metadata": {"name": "going"}})
    detach = registry.attach_kubelet("n1")
    seed_pod(registry, "going", "held", node="n1", phase="Running")
    registry.delete(NAMESPACES, None, "going")
    with pytest.raises(errors.ApiError) as closing:
        registry.create(PODS, pod_manifest("p"), namespace="going")
    assert closing.value.code == 403
    assert "because it is being terminated" in closing.value.message
    registry.delete(PODS, "going", "held", DeleteOptions(grace_period_seconds=0))
    assert not registry.store.exists(NAMESPACES, None, "going")
    detach()


def test_status_and_spec_are_written_separately(registry: Registry) -> None:
    created = registry.create(PODS, pod_manifest("p"), namespace=NS)
    created["status"]["phase"] = "Running"
    created["metadata"]["labels"] = {"x": "y"}
    after_put = registry.replace(PODS, created)
    assert after_put["status"]["phase"] == "Pending"
    assert after_put["metadata"]["labels"] == {"x": "y"}
    after_status = registry.patch(
        PODS,
        NS,
        "p",
        {"status": {"phase": "Running"}, "metadata": {"labels": {"q": "r"}}},
        PatchType.MERGE,
        subresource="status",
    )
    assert after_status["status"]["phase"] == "Running"
    assert after_status["metadata"]["labels"] == {"x": "y"}


def test_generation_counts_spec_changes_only(registry: Registry) -> None:
    job = registry.create(JOBS, job_manifest("j"), namespace=NS)
    labelled = registry.patch(JOBS, NS, "j", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    suspended = registry.patch(JOBS, NS, "j", {"spec": {"suspend": True}})
    assert suspended["metadata"]["generation"] == 2
    assert job["metadata"]["uid"] == suspended["metadata"]["uid"]


def test_noop_update_keeps_the_resource_version(registry: Registry) -> None:
    created = registry.create(
        SECRETS, {"metadata": {"name": "s"}, "stringData": {"k": "v"}}, namespace=NS
    )
    assert created["data"] == {"k": "dg=="}
    again = registry.patch(SECRETS, NS, "s", {"data": {"k": "dg=="}})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_stale_resource_version_in_patch_conflicts(registry: Registry) -> None:
    created = registry.create(PODS, pod_manifest("p"), namespace=NS)
    registry.patch(PODS, NS, "p", {"metadata": {"labels": {"a": "1"}}})
    stale = {
        "metadata": {
            "resourceVersion": created["metadata"]["resourceVersion"],
            "labels": {"a": "2"},
        }
    }
    with pytest.raises(errors.ApiError) as caught:
        registry.patch(PODS, NS, "p", stale, PatchType.MERGE)
    assert caught.value.code == 409


def test_pod_spec_is_immutable_except_images(registry: Registry) -> None:
    registry.create(PODS, pod_manifest("p"), namespace=NS)
    registry.patch(PODS, NS, "p", {"spec": {"containers": [{"name": "main", "image": "new"}]}})
    with pytest.raises(errors.ApiError) as caught:
        registry.patch(PODS, NS, "p", {"spec": {"nodeName": "n1"}})
    assert "pod updates may not change fields" in caught.value.message


def test_scale_subresource(registry: Registry) -> None:
    registry.create(DEPLOYMENTS, deployment_manifest("d"), namespace=NS)
    scale = registry.patch(
        DEPLOYMENTS, NS, "d", {"spec": {"replicas": 3}}, PatchType.MERGE, subresource="scale"
    )
    assert scale["kind"] == "Scale"
    assert (scale["spec"]["replicas"], scale["status"]["selector"]) == (3, "app=d")
    deployment = registry.get(DEPLOYMENTS, NS, "d")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["metadata"]["generation"] == 2


def test_binding_assigns_a_node_once(registry: Registry) -> None:
    registry.create(PODS, pod_manifest("p"), namespace=NS)
    bound = registry.bind(NS, "p", "n1")
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["status"]["conditions"][0]["type"] == "PodScheduled"
    with pytest.raises(errors.ApiError) as caught:
        registry.bind(NS, "p", "n2")
    assert caught.value.code == 409


def test_graceful_deletion_waits_for_an_attached_kubelet(registry: Registry) -> None:
    seed_node(registry, "n1")
    seed_pod(registry, NS, "p", node="n1", phase="Running")
    detach = registry.attach_kubelet("n1")
    outcome = registry.delete(PODS, NS, "p")
    assert not outcome.finished
    assert outcome.object["metadata"]["deletionGracePeriodSeconds"] == 30
    assert registry.get(PODS, NS, "p")["metadata"]["deletionTimestamp"]
    confirmed = registry.delete(PODS, NS, "p", DeleteOptions(grace_period_seconds=0))
    assert confirmed.finished
    assert not registry.store.exists(PODS, NS, "p")
    detach()
    seed_pod(registry, NS, "q", node="n1", phase="Running")
    assert registry.delete(PODS, NS, "q").finished, "no kubelet: gone at once"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            DeleteOptions(precondition_uid="other"),
            "Precondition failed: UID in precondition: other, UID in object meta: ",
        ),
        (
            DeleteOptions(precondition_rv="other"),
            "Precondition failed: ResourceVersion in precondition: other, ResourceVersion",
        ),
    ],
)
def test_a_delete_whose_precondition_names_another_object_is_409(
    registry: Registry, options: DeleteOptions, message: str
) -> None:
    secret = registry.create(SECRETS, {"metadata": {"name": "s"}}, namespace=NS)
    with pytest.raises(errors.ApiError) as caught:
        registry.delete(SECRETS, NS, "s", options)
    assert caught.value.code == 409
    assert message in caught.value.message
    assert registry.store.exists(SECRETS, NS, "s")
    meta = secret["metadata"]
    right = DeleteOptions(precondition_uid=meta["uid"], precondition_rv=meta["resourceVersion"])
    assert registry.delete(SECRETS, NS, "s", right).finished


def test_eviction_deletes_the_pod(registry: Registry) -> None:
    seed_pod(registry, NS, "p", node="n1")
    registry.evict(
        NS,
        "p",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": NS}},
    )
    assert not registry.store.exists(PODS, NS, "p")


@pytest.mark.parametrize(
    ("policy", "pods_left", "warned"),
    [("Background", 0, False), ("Foreground", 0, False), ("Orphan", 2, False), (None, 2, True)],
)
def test_job_deletion_propagation(
    registry: Registry, policy: str | None, pods_left: int, warned: bool
) -> None:
    job = registry.create(JOBS, job_manifest("j"), namespace=NS)
    for i in range(2):
        seed_pod(registry, NS, f"j-{i}", owner=owned_by(job))
    outcome = registry.delete(JOBS, NS, "j", DeleteOptions(propagation_policy=policy))
    assert bool(outcome.warnings) is warned
    assert not registry.store.exists(JOBS, NS, "j")
    left = registry.list(PODS, NS).items()
    assert len(left) == pods_left
    assert all(not p["metadata"].get("ownerReferences") for p in left)


def test_foreground_deletion_waits_for_terminating_dependents(registry: Registry) -> None:
    job = registry.create(JOBS, job_manifest("j"), namespace=NS)
    seed_pod(registry, NS, "j-0", node="n1", phase="Running", owner=owned_by(job))
    detach = registry.attach_kubelet("n1")
    outcome = registry.delete(JOBS, NS, "j", DeleteOptions(propagation_policy="Foreground"))
    assert outcome.object["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert registry.get(PODS, NS, "j-0")["metadata"]["deletionTimestamp"]
    assert registry.store.exists(JOBS, NS, "j")
    registry.delete(PODS, NS, "j-0", DeleteOptions(grace_period_seconds=0))
    assert not registry.store.exists(JOBS, NS, "j")
    detach()


def test_dependent_with_a_live_owner_survives(registry: Registry) -> None:
    first = registry.create(JOBS, job_manifest("a"), namespace=NS)
    second = registry.create(JOBS, job_manifest("b"), namespace=NS)
    seed_pod(registry, NS, "shared", owner=owned_by(first))
    registry.patch(
        PODS,
        NS,
        "shared",
        {
            "metadata": {
                "ownerReferences": [owned_by(first), {**owned_by(second), "controller": False}]
            }
        },
    )
    registry.delete(JOBS, NS, "a", DeleteOptions(propagation_policy="Background"))
    refs = registry.get(PODS, NS, "shared")["metadata"]["ownerReferences"]
    assert [r["name"] for r in refs] == ["b"]


def test_finalizers_hold_deletion_until_removed(registry: Registry) -> None:
    registry.create(NODES, {"metadata": {"name": "n", "finalizers": ["example.com/hold"]}})
    outcome = registry.delete(NODES, None, "n")
    assert not outcome.finished
    registry.patch(NODES, None, "n", {"metadata": {"finalizers": None}}, PatchType.MERGE)
    assert not registry.store.exists(NODES, None, "n")


def test_namespace_deletion_empties_it(registry: Registry) -> None:
    seed_pod(registry, NS, "p")
    registry.create(JOBS, job_manifest("j"), namespace=NS)
    outcome = registry.delete(NAMESPACES, None, NS)
    assert outcome.object["status"]["phase"] == "Terminating"
    assert not registry.store.exists(NAMESPACES, None, NS)
    assert registry.store.count(PODS, NS) == registry.store.count(JOBS, NS) == 0
