"""Raw HTTP details clients depend on: /version, legacy and aggregated discovery, OpenAPI
documents, server-side Tables, protobuf request bodies, and the Status codes of malformed
requests (404 for unknown paths, 405, 400, 415)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import urllib3

from sandbox.discovery import AGGREGATED_V2

Http = Callable[..., urllib3.BaseHTTPResponse]


def body(response: urllib3.BaseHTTPResponse) -> Any:
    return json.loads(response.data)


def test_version_is_public_and_gke_shaped(http: Http) -> None:
    response = http("GET", "/version", anonymous=True)
    assert response.status == 200
    version = body(response)
    assert (version["major"], version["minor"]) == ("1", "32")
    assert version["gitVersion"].startswith("v1.32.")
    assert "-gke." in version["gitVersion"]


def test_legacy_discovery_names_eviction_and_scale(http: Http) -> None:
    core = {r["name"]: r for r in body(http("GET", "/api/v1"))["resources"]}
    assert core["pods"]["shortNames"] == ["po"]
    assert (core["pods/eviction"]["group"], core["pods/eviction"]["kind"]) == ("policy", "Eviction")
    assert core["nodes"]["namespaced"] is False
    apps = {r["name"]: r for r in body(http("GET", "/apis/apps/v1"))["resources"]}
    assert (apps["deployments/scale"]["group"], apps["deployments/scale"]["kind"]) == (
        "autoscaling",
        "Scale",
    )
    groups = {g["name"] for g in body(http("GET", "/apis"))["groups"]}
    assert {"apps", "batch"} <= groups
    assert body(http("GET", "/apis/batch"))["preferredVersion"]["groupVersion"] == "batch/v1"


def test_aggregated_discovery(http: Http) -> None:
    accept = f"{AGGREGATED_V2},application/json"
    response = http("GET", "/apis", headers={"Accept": accept})
    assert response.headers["Content-Type"] == AGGREGATED_V2
    document = body(response)
    assert document["kind"] == "APIGroupDiscoveryList"
    batch = next(i for i in document["items"] if i["metadata"].get("name") == "batch")
    jobs = batch["versions"][0]["resources"][0]
    assert (jobs["resource"], jobs["scope"]) == ("jobs", "Namespaced")


def test_openapi_documents(http: Http) -> None:
    root = body(http("GET", "/openapi/v3"))
    url = root["paths"]["api/v1"]["serverRelativeURL"]
    document = body(http("GET", url))
    patch = document["paths"]["/api/v1/namespaces/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "",
        "version": "v1",
        "kind": "Namespace",
    }
    assert any(p["name"] == "fieldValidation" for p in patch["parameters"])
    v2 = http(
        "GET",
        "/openapi/v2",
        headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
    )
    assert (v2.status, v2.data) == (200, b"")


def test_tables_for_kubectl(http: Http, namespace: str) -> None:
    table = body(
        http(
            "GET",
            "/api/v1/namespaces",
            headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
        )
    )
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Status", "Age"]
    row = next(r for r in table["rows"] if r["cells"][0] == namespace)
    assert row["cells"][1] == "Active"
    assert row["object"]["kind"] == "PartialObjectMetadata"


def test_malformed_requests(http: Http, namespace: str) -> None:
    unknown = http("GET", f"/api/v1/namespaces/{namespace}/widgets")
    assert (unknown.status, body(unknown)["message"]) == (
        404,
        "the server could not find the requested resource",
    )
    nowhere = http(
        "POST",
        "/api/v1/namespaces/nowhere/pods",
        body={"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    assert (nowhere.status, body(nowhere)["message"]) == (404, 'namespaces "nowhere" not found')
    named_post = http("POST", f"/api/v1/namespaces/{namespace}/pods/p", body={})
    assert body(named_post)["reason"] == "MethodNotAllowed"
    assert named_post.status == 405
    garbage = http(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert garbage.status == 400
    wrong_ns = http(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body={"metadata": {"name": "p", "namespace": "other"}},
    )
    assert wrong_ns.status == 400
    for method, path in (
        ("DELETE", f"/api/v1/namespaces/{namespace}/pods/p/status"),
        ("PATCH", f"/api/v1/namespaces/{namespace}/pods/p/log"),
        ("PUT", f"/api/v1/namespaces/{namespace}/pods"),
        ("DELETE", "/api/v1/namespaces"),
    ):
        assert http(method, path, body={}).status == 405, (method, path)
    assert http("GET", f"/api/v1/namespaces/{namespace}/pods/p/exec").status == 404
    bad_patch = http(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        body=b"{}",
        headers={"Content-Type": "text/plain"},
    )
    assert bad_patch.status == 415
