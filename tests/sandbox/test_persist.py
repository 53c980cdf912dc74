"""The sandbox's cluster across a stop and a start (`sandbox.persist`): a snapshot keeps every
object as it was (uid, resourceVersion, creationTimestamp) and the store's counter, which goes
on from there; a watch from before the restart is 410; the pods that ran are ended as GKE's
node shutdown ends them, the unbound ones wait, a pod being deleted is gone; a file that
cannot be loaded is refused naming the file and `dev up --fresh`, no file is the scenario.

Then a whole sandbox (`sandbox.serve.start`) stopped and started on its state directory: a
node added since keeps its name, labels and card, the scenario's Deployment and a Secret keep
their uids, the Deployment's pod that died is replaced, a Job's failed pod counts against its
backoffLimit; `fresh` starts from the scenario again.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from sandbox import errors, persist
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, EVENTS, JOBS, NAMESPACES, NODES, PODS, SECRETS
from sandbox.scenario import Gpus, NodeSpec
from sandbox.serve import RunningSandbox, start
from sandbox.store import Store
from tests.controlplane import quick_scenario
from tests.waiting import eventually

JOINED = NodeSpec(
    name="gke-joined",
    labels={"cloud.google.com/gke-nodepool": "joined-pool"},
    gpus=Gpus(count=1),
    internal_ip="127.0.10.77",
    external_ip="127.0.20.77",
)


def _pod(name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "team"}, "spec": spec}


def _saved_registry(tmp_path: Path) -> tuple[Registry, int]:
    """A registry with a namespace, a Secret, a deleted ConfigMap and three pods, saved."""
    registry = Registry()
    registry.create(NAMESPACES, {"metadata": {"name": "team"}})
    registry.create(
        SECRETS, {"metadata": {"name": "token"}, "stringData": {"token": "s3"}}, namespace="team"
    )
    for name, node in (("running", "n1"), ("waiting", None), ("leaving", "n1")):
        registry.create(PODS, _pod(name, node), namespace="team")
    running = registry.get(PODS, "team", "running")
    running["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": "main", "ready": True, "state": {"running": {"startedAt": "x"}}}
        ],
    }
    registry.replace(PODS, running, subresource="status")
    leaving = registry.get(PODS, "team", "leaving")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    registry.store.update(PODS, leaving)
    registry.store.delete(SECRETS, "team", "token")  # the counter moves past every object
    registry.create(
        SECRETS, {"metadata": {"name": "token"}, "stringData": {"token": "s3"}}, namespace="team"
    )
    registry.store.delete(NAMESPACES, None, "kube-public")
    persist.save(tmp_path, registry.store, [])
    return registry, registry.store.resource_version


def _loaded(tmp_path: Path) -> Store:
    snapshot = persist.load(tmp_path)
    assert snapshot is not None
    store = Store()
    persist.restore(store, snapshot)
    return store


def test_a_snapshot_keeps_every_object_and_the_counter(tmp_path: Path) -> None:
    registry, counter = _saved_registry(tmp_path)
    assert persist.snapshot_path(tmp_path).stat().st_mode & 0o777 == 0o600
    store = _loaded(tmp_path)
    before = {(r.plural, raw) for r, raw in registry.store.objects() if r is not PODS}
    after = {(r.plural, raw) for r, raw in store.objects() if r is not PODS}
    assert after == before, "uid, resourceVersion, creationTimestamp and data as they were"
    assert store.resource_version > counter  # the pods the power cycle ended took versions
    created = store.create(NAMESPACES, {"metadata": {"name": "later"}})
    assert int(created["metadata"]["resourceVersion"]) == store.resource_version
    secret = store.get(SECRETS, "team", "token")
    assert secret["metadata"]["uid"] == registry.get(SECRETS, "team", "token")["metadata"]["uid"]
    assert store.dependents("nothing") == []
    assert not store.exists(NAMESPACES, None, "kube-public"), "a deleted object stays deleted"


def test_a_watch_from_before_the_restart_is_gone(tmp_path: Path) -> None:
    _, counter = _saved_registry(tmp_path)
    store = _loaded(tmp_path)
    with pytest.raises(errors.ApiError) as caught:
        store.watch(PODS, "team", since=str(counter - 1))
    assert caught.value.code == 410


def test_the_pods_that_ran_are_ended_by_the_node_shutdown(tmp_path: Path) -> None:
    _, counter = _saved_registry(tmp_path)
    store = _loaded(tmp_path)
    ended = store.get(PODS, "team", "running")
    status = ended["status"]
    assert status["phase"] == "Failed"
    assert status["reason"] == "Terminated"
    assert status["message"] == "Pod was terminated in response to imminent node shutdown."
    disruption = next(c for c in status["conditions"] if c["type"] == "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "TerminationByKubelet")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    [container] = status["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 137
    assert not container["ready"]
    assert int(ended["metadata"]["resourceVersion"]) > counter
    waiting = store.get(PODS, "team", "waiting")
    assert (waiting.get("status") or {}).get("phase") == "Pending", "unbound: it waits"
    assert not store.exists(PODS, "team", "leaving"), "its kubelet would have confirmed it"


def test_events_past_their_ttl_expired_while_it_was_down(tmp_path: Path) -> None:
    store = Store()
    now = dt.datetime.now(dt.UTC)
    for name, age in (("old", dt.timedelta(hours=2)), ("recent", dt.timedelta(minutes=5))):
        stamp = (now - age).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {"metadata": {"name": name, "namespace": "team"}, "lastTimestamp": stamp}
        store.create(EVENTS, event)
    persist.save(tmp_path, store, [])
    loaded = _loaded(tmp_path)
    assert not loaded.exists(EVENTS, "team", "old"), "etcd's TTL (1 h) ran out"
    assert loaded.exists(EVENTS, "team", "recent")


async def test_a_crash_loses_at_most_the_last_period(tmp_path: Path) -> None:
    """Saved while it runs, not only on a clean stop: what a SIGKILL leaves is loadable."""
    store = Store()
    saver = persist.Saver(tmp_path, store, list, period_s=0.05)
    saver.start()
    try:
        store.create(NAMESPACES, {"metadata": {"name": "later"}})

        async def saved() -> bool:
            snapshot = persist.load(tmp_path)
            return snapshot is not None and any(
                o["metadata"]["name"] == "later" for _, o in snapshot.objects
            )

        await eventually(saved, within=10)
    finally:
        await saver.stop()


def test_no_snapshot_is_the_scenario(tmp_path: Path) -> None:
    assert persist.load(tmp_path) is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"format": "levers9-sandbox-cluster/1", "resourceV', "Unterminated string"),
        ('{"format": "something-else"}', "format 'something-else'"),
        ("[]", "format None"),
        (
            '{"format": "levers9-sandbox-cluster/1", "resourceVersion": 3, "nodes": [],'
            ' "objects": [{"resource": "example.com/v1/widgets", "object": {}}]}',
            "no resource example.com/v1/widgets is served",
        ),
        (
            '{"format": "levers9-sandbox-cluster/1", "resourceVersion": 3, "nodes": [],'
            ' "objects": [{"resource": "/v1/pods", "object": {"metadata": {"name": "p"}}}]}',
            "'uid'",
        ),
    ],
)
def test_a_snapshot_that_cannot_be_loaded_is_named_with_the_way_out(
    tmp_path: Path, content: str, why: str
) -> None:
    path = persist.snapshot_path(tmp_path)
    path.write_text(content)
    with pytest.raises(persist.SnapshotError) as caught:
        persist.load(tmp_path)
    message = str(caught.value)
    assert str(path) in message
    assert why in message
    assert "levers9 dev up --fresh" in message


def _job(name: str, backoff: int) -> dict[str, Any]:
    template = {
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"cloud.google.com/gke-nodepool": "default-pool"},
            "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.10.1"}],
        }
    }
    return {"metadata": {"name": name}, "spec": {"backoffLimit": backoff, "template": template}}


def _pods(running: RunningSandbox, selector: str) -> list[dict[str, Any]]:
    return running.sandbox.registry.list(PODS, None, label_selector=selector).items()


async def _until_running(running: RunningSandbox, selector: str) -> dict[str, Any]:
    async def one_runs() -> bool:
        return any(p["status"].get("phase") == "Running" for p in _pods(running, selector))

    await eventually(one_runs, within=30)
    return next(p for p in _pods(running, selector) if p["status"].get("phase") == "Running")


async def test_a_restarted_sandbox_powers_its_cluster_up_again(tmp_path: Path) -> None:
    state = tmp_path / "sandbox"
    first = await start(quick_scenario(), state)
    try:
        assert not first.restored
        await first.cluster.add_node(JOINED)
        registry = first.sandbox.registry
        registry.create(
            SECRETS,
            {"metadata": {"name": "agent"}, "stringData": {"token": "t"}},
            namespace="default",
        )
        for name, backoff in (("once", 0), ("twice", 1)):
            registry.create(JOBS, _job(name, backoff), namespace="default")
        served = await _until_running(first, "app=model-server")
        jobs = {n: await _until_running(first, f"job-name={n}") for n in ("once", "twice")}
        kept = {
            (r.plural, n): registry.get(r, "default", n)["metadata"]
            for r, n in ((SECRETS, "agent"), (DEPLOYMENTS, "model-server"), (JOBS, "once"))
        }
        counter = registry.store.resource_version
    finally:
        await first.close()

    second = await start(quick_scenario(), state)
    try:
        assert second.restored
        assert json.loads((state / "sandbox.json").read_text())["restored"] is True
        registry = second.sandbox.registry
        assert registry.store.resource_version > counter
        node = registry.get(NODES, None, "gke-joined")
        assert node["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == "joined-pool"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
        assert second.cluster.kubelet("gke-joined") is not None
        for (plural, name), meta in kept.items():
            resource = {"secrets": SECRETS, "deployments": DEPLOYMENTS, "jobs": JOBS}[plural]
            now = registry.get(resource, "default", name)["metadata"]
            assert (now["uid"], now["creationTimestamp"]) == (
                meta["uid"],
                meta["creationTimestamp"],
            )
        old = registry.get(PODS, "default", served["metadata"]["name"])
        assert old["status"]["phase"] == "Failed"
        assert old["status"]["reason"] == "Terminated"
        new = await _until_running(second, "app=model-server")
        assert new["metadata"]["uid"] != served["metadata"]["uid"]

        async def once_failed() -> bool:
            conditions = registry.get(JOBS, "default", "once").get("status", {}).get("conditions")
            return any(c["type"] == "Failed" for c in conditions or ())

        await eventually(once_failed, within=30)
        again = await _until_running(second, "job-name=twice")
        assert again["metadata"]["uid"] != jobs["twice"]["metadata"]["uid"]
        assert registry.get(JOBS, "default", "twice")["status"].get("failed") == 1
        await second.cluster.remove_node("gke-joined")
    finally:
        await second.close()

    third = await start(quick_scenario(), state)
    try:
        assert not third.sandbox.registry.store.exists(NODES, None, "gke-joined"), "removed"
    finally:
        await third.close()

    fresh = await start(quick_scenario(), state, fresh=True)
    try:
        assert not fresh.restored
        registry = fresh.sandbox.registry
        assert not registry.store.exists(JOBS, "default", "once")
        assert (
            registry.get(DEPLOYMENTS, "default", "model-server")["metadata"]["uid"]
            != (kept[("deployments", "model-server")]["uid"])
        )
    finally:
        await fresh.close()
