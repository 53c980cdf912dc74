"""Fault injection and the request counter through the admin API: rules fire a limited number
of times with the apiserver's own Status (429 with Retry-After, 500, 503), delays, dropped
connections, and per verb/resource call counts that reset."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3
from kubernetes import client

from tests.sandbox.factories import Api, status_of
from tests.waiting import until

Http = Callable[..., urllib3.BaseHTTPResponse]


def add_fault(http: Http, **rule: Any) -> dict[str, Any]:
    response = http("POST", "/_sandbox/faults", body=rule)
    assert response.status == 201, response.data
    created: dict[str, Any] = json.loads(response.data)
    return created


def counts(http: Http) -> dict[tuple[str, str], int]:
    body = json.loads(http("GET", "/_sandbox/requests").data)
    return {(c["verb"], c["resource"]): c["count"] for c in body["counts"]}


def test_a_500_rule_fires_n_times_then_stops(http: Http, core: Api, namespace: str) -> None:
    rule = add_fault(http, verb="list", resource="pods", status=500, times=2)
    for _ in range(2):
        with pytest.raises(client.ApiException) as caught:
            core.list_namespaced_pod(namespace)
        body = status_of(caught.value)
        assert (caught.value.status, body["reason"]) == (500, "InternalError")
    assert core.list_namespaced_pod(namespace).items == []
    core.list_namespace()  # other resources were never affected
    listed = json.loads(http("GET", "/_sandbox/faults").data)["rules"]
    assert [(r["id"], r["fired"]) for r in listed] == [(rule["id"], 2)]


def test_429_carries_retry_after(http: Http, core: Api, namespace: str) -> None:
    add_fault(http, verb="create", resource="pods", status=429, retryAfterSeconds=3, times=1)
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        )
    assert caught.value.status == 429
    assert (caught.value.headers or {}).get("Retry-After") == "3"
    assert status_of(caught.value)["details"]["retryAfterSeconds"] == 3


def _fired(http: Http, rule: dict[str, Any]) -> int:
    rules = json.loads(http("GET", "/_sandbox/faults").data)["rules"]
    return int(next(r["fired"] for r in rules if r["id"] == rule["id"]))


def test_delay_and_drop(http: Http, core: Api, namespace: str) -> None:
    rule = add_fault(http, verb="get", resource="namespaces", delaySeconds=2, times=1)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(core.read_namespace, namespace)
        # The request reached the server, which holds it.
        until(lambda: _fired(http, rule), within=10, what="the delayed request held", poll=0.02)
        core.list_namespace()  # answered while the delayed one is held
        assert not held.done(), "the delay holds the request it matched, and only that one"
        assert held.result(timeout=10).metadata.name == namespace  # then answers it
    add_fault(http, verb="list", resource="nodes", drop=True, times=1)
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_node()
    core.list_node()


def test_rules_are_validated_and_removable(http: Http) -> None:
    assert http("POST", "/_sandbox/faults", body={"verb": "fly", "status": 500}).status == 400
    assert http("POST", "/_sandbox/faults", body={"verb": "get"}).status == 400
    rule = add_fault(http, verb="get", resource="pods", status=503)
    assert http("DELETE", f"/_sandbox/faults/{rule['id']}").status == 200
    assert json.loads(http("GET", "/_sandbox/faults").data)["rules"] == []


def test_request_counter_counts_and_resets(http: Http, core: Api, namespace: str) -> None:
    http("DELETE", "/_sandbox/requests")
    for _ in range(3):
        core.list_namespaced_pod(namespace)
    core.read_namespace(namespace)
    core.list_pod_for_all_namespaces(limit=1)
    seen = counts(http)
    assert seen[("list", "pods")] == 4
    assert seen[("get", "namespaces")] == 1
    http("DELETE", "/_sandbox/requests")
    assert counts(http) == {}
