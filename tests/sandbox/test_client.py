"""The official Python client against the emulator: CRUD, the Status bodies of 404/409/422/400,
optimistic concurrency, the three patch formats, pagination, watch, subresources (scale,
eviction, log, status) and delete responses."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch

from sandbox.resources import PODS
from sandbox.server import Sandbox
from tests.sandbox.factories import (
    HISTORY,
    Api,
    deployment_manifest,
    pod_manifest,
    seed_pod,
    status_of,
)

Call = Callable[..., Any]


def test_create_get_replace_delete(core: Api, namespace: str) -> None:
    created = core.create_namespaced_pod(namespace, pod_manifest("p", {"app": "x"}))
    assert created.status.phase == "Pending"
    fetched = core.read_namespaced_pod("p", namespace)
    fetched.metadata.labels["tier"] = "gpu"
    replaced = core.replace_namespaced_pod("p", namespace, fetched)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    deleted = core.delete_namespaced_pod("p", namespace)
    assert deleted.metadata.name == "p", "pods come back from DELETE as the object"


def test_not_found_status(core: Api, namespace: str) -> None:
    with pytest.raises(client.ApiException) as caught:
        core.read_namespaced_pod("x", namespace)
    assert caught.value.status == 404
    assert status_of(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "x" not found',
        "reason": "NotFound",
        "details": {"name": "x", "kind": "pods"},
        "code": 404,
    }


def test_already_exists_and_conflict(core: Api, namespace: str) -> None:
    first = core.create_namespaced_pod(namespace, pod_manifest("p"))
    with pytest.raises(client.ApiException) as exists:
        core.create_namespaced_pod(namespace, pod_manifest("p"))
    assert (exists.value.status, status_of(exists.value)["reason"]) == (409, "AlreadyExists")
    core.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(client.ApiException) as stale:
        core.replace_namespaced_pod("p", namespace, first)
    assert (stale.value.status, status_of(stale.value)["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status_of(stale.value)["message"]


def test_invalid_and_bad_requests(core: Api, namespace: str) -> None:
    with pytest.raises(client.ApiException) as invalid:
        core.create_namespaced_pod(namespace, pod_manifest("Not-Valid"))
    body = status_of(invalid.value)
    assert (invalid.value.status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith('Pod "Not-Valid" is invalid: metadata.name: Invalid value')
    with pytest.raises(client.ApiException) as bad:
        core.list_namespaced_pod(namespace, field_selector="spec.image=x")
    assert (bad.value.status, status_of(bad.value)["message"]) == (
        400,
        "field label not supported: spec.image",
    )


def test_patch_formats(core: Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("p"))
    strategic = core.patch_namespaced_pod(
        "p", namespace, {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}
    )
    assert strategic.spec.containers[0].image == "busybox:2"
    as_json = core.patch_namespaced_pod(
        "p", namespace, [{"op": "add", "path": "/metadata/labels", "value": {"j": "1"}}]
    )
    assert as_json.metadata.labels == {"j": "1"}
    merged = core.patch_namespaced_pod(
        "p",
        namespace,
        {"metadata": {"labels": {"m": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"j": "1", "m": "2"}
    with pytest.raises(client.ApiException) as unsupported:
        core.patch_namespaced_pod(
            "p", namespace, {"metadata": {}}, _content_type="application/apply-patch+yaml"
        )
    assert unsupported.value.status == 415


def test_pagination_returns_every_pod_once(
    core: Api, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    def seed() -> None:
        for i in range(1200):
            sandbox.registry.store.create(
                PODS,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p-{i:04d}", "namespace": namespace},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            )

    sandbox_call(seed)
    names: list[str] = []
    remaining: list[int | None] = []
    token = None
    pages = 0
    while True:
        page = core.list_namespaced_pod(namespace, limit=500, _continue=token)
        pages += 1
        names += [p.metadata.name for p in page.items]
        remaining.append(page.metadata.remaining_item_count)
        token = page.metadata._continue
        if not token:
            break
    assert pages == 3
    assert len(names) == len(set(names)) == 1200
    assert remaining == [700, 200, None]


def test_label_and_field_selectors(
    core: Api, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    sandbox_call(
        seed_pod,
        sandbox.registry,
        namespace,
        "a",
        node="n-sel",
        labels={"app": "x"},
        phase="Running",
    )
    sandbox_call(
        seed_pod,
        sandbox.registry,
        namespace,
        "b",
        node="n-sel",
        labels={"app": "y"},
        phase="Succeeded",
    )
    sandbox_call(seed_pod, sandbox.registry, namespace, "c", labels={"app": "x"})

    def names(**kwargs: Any) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(namespace, **kwargs).items]

    assert names(label_selector="app=x") == ["a", "c"]
    assert names(label_selector="app notin (x)") == ["b"]
    assert names(field_selector="spec.nodeName=n-sel,status.phase!=Succeeded") == ["a"]
    everywhere = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n-sel")
    assert sorted(p.metadata.name for p in everywhere.items) == ["a", "b"]


def test_watch_streams_added_modified_deleted(core: Api, namespace: str) -> None:
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    events: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(
            core.list_namespaced_pod, namespace, resource_version=start, timeout_seconds=10
        ):
            events.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                stream.stop()
        done.set()

    follower = threading.Thread(target=follow)
    follower.start()
    core.create_namespaced_pod(namespace, pod_manifest("w"))
    core.patch_namespaced_pod("w", namespace, {"metadata": {"labels": {"x": "y"}}})
    core.delete_namespaced_pod("w", namespace)
    assert done.wait(10)
    follower.join()
    assert events == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


def test_watch_from_a_compacted_version_is_gone(
    core: Api, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    def churn() -> None:
        for i in range(HISTORY + 10):
            sandbox.registry.store.create(
                PODS, {"metadata": {"name": f"c{i}", "namespace": namespace}}
            )

    sandbox_call(churn)
    stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
    with pytest.raises(client.ApiException) as caught:
        for _ in stream.stream(
            core.list_namespaced_pod, namespace, resource_version="1", timeout_seconds=2
        ):
            pass
    assert caught.value.status == 410


def test_watch_bookmarks(core: Api, namespace: str) -> None:
    response = core.list_namespaced_pod(
        namespace, watch=True, allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False
    )
    lines = [json.loads(line) for line in response.data.decode().splitlines() if line]
    assert response.headers["Transfer-Encoding"] == "chunked"
    assert lines
    assert all(line["type"] == "BOOKMARK" for line in lines)
    assert lines[-1]["object"]["metadata"]["resourceVersion"]


def test_scale_subresource(apps: Api, namespace: str) -> None:
    apps.create_namespaced_deployment(namespace, deployment_manifest("model", replicas=2))
    scale = apps.read_namespaced_deployment_scale("model", namespace)
    assert (scale.spec.replicas, scale.status.selector) == (2, "app=model")
    apps.patch_namespaced_deployment_scale("model", namespace, {"spec": {"replicas": 1}})
    assert apps.read_namespaced_deployment("model", namespace).spec.replicas == 1


def test_eviction_log_and_status(
    core: Api, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    sandbox_call(seed_pod, sandbox.registry, namespace, "p", node="n-ev", phase="Running")
    sandbox_call(sandbox.registry.logs.write, namespace, "p", "main", "line one\nline two\n")
    assert core.read_namespaced_pod_log("p", namespace) == "line one\nline two\n"
    assert core.read_namespaced_pod_log("p", namespace, tail_lines=1) == "line two\n"
    status = core.read_namespaced_pod_status("p", namespace)
    assert status.status.phase == "Running"
    core.create_namespaced_pod_eviction(
        "p",
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "p", "namespace": namespace},
        },
    )
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_pod("p", namespace)
    assert gone.value.status == 404


def test_job_delete_answers_with_status_and_warns_about_orphans(batch: Api, namespace: str) -> None:
    manifest = {
        "metadata": {"name": "j"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
            }
        },
    }
    batch.create_namespaced_job(namespace, manifest)
    response = batch.delete_namespaced_job("j", namespace, _preload_content=False)
    body = json.loads(response.data)
    assert body["status"] == "Success"
    assert body["details"]["group"] == "batch"
    assert "child pods are preserved" in response.headers["Warning"]


def test_delete_collection(core: Api, namespace: str) -> None:
    for name in ("a", "b", "c"):
        core.create_namespaced_pod(
            namespace, pod_manifest(name, {"del": "yes" if name != "c" else "no"})
        )
    core.delete_collection_namespaced_pod(namespace, label_selector="del=yes")
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["c"]
