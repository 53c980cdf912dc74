"""Watches and lists as a real apiserver serves them, through the official client and raw HTTP:
events in resourceVersion order, bookmarks to resume from, `timeoutSeconds`, 410 Expired for a
version older than the watch cache's window (count and age) or after a compaction, watch
streams ended by an apiserver restart (`/_sandbox/watches/drop`; `Sandbox.crash` also cuts every
connection and closes the port until `serve_again`), and paginated lists served
from one snapshot whose continue token expires."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from sandbox.admin_client import SandboxAdmin
from sandbox.continuation import CONTINUE_EXPIRED
from sandbox.registry import Registry
from sandbox.resources import NAMESPACES
from sandbox.server import Sandbox
from sandbox.store import DEFAULT_CONTINUE_TTL_SECONDS, DEFAULT_HISTORY_SECONDS, Store
from sandbox.threaded import SandboxThread
from tests.sandbox.factories import Api, api_client, pod_manifest, status_of, unique

Http = Callable[..., urllib3.BaseHTTPResponse]
Call = Callable[..., Any]


class Clock:
    """The seconds the store ages its watch history and list snapshots by, moved by the test:
    a window has elapsed when the store's own clock says so, with no wait."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def aged(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SandboxThread, Api, Clock]]:
    """A second emulator whose store ages by a clock the test moves (the default windows: 75 s
    of watch history, 300 s continue tokens), an admin CoreV1Api on it, and the clock."""
    clock = Clock()
    thread = SandboxThread(registry=Registry(Store(clock=clock)))
    thread.start()
    ca = tmp_path_factory.mktemp("aged") / "ca.crt"
    ca.write_bytes(thread.sandbox.ca.ca_pem)
    core = client.CoreV1Api(api_client(thread.sandbox.url, ca, thread.sandbox.admin_token))
    yield thread, core, clock
    thread.stop()


@pytest.fixture
def admin(sandbox: Sandbox, ca_file: Path, tmp_path: Path) -> SandboxAdmin:
    """The admin client, as the CLI finds a sandbox: by its state directory."""
    (tmp_path / "sandbox.json").write_text(json.dumps({"url": sandbox.url}))
    (tmp_path / "admin-token").write_text(sandbox.admin_token)
    (tmp_path / "ca.crt").write_bytes(ca_file.read_bytes())
    return SandboxAdmin(tmp_path)


def _rv(obj: Any) -> int:
    return int(obj.metadata.resource_version)


def _watch_lines(http: Http, path: str) -> list[dict[str, Any]]:
    response = http("GET", path, timeout=10)
    assert response.status == 200
    return [json.loads(line) for line in response.data.decode().splitlines() if line]


# -- watches -----------------------------------------------------------------------------------


def test_watch_events_come_in_resource_version_order(core: Api, namespace: str) -> None:
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    for name in ("a", "b", "c"):
        core.create_namespaced_pod(namespace, pod_manifest(name))
    core.patch_namespaced_pod("a", namespace, {"metadata": {"labels": {"x": "y"}}})
    core.delete_namespaced_pod("b", namespace)
    stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
    seen: list[tuple[str, str, int]] = []
    for event in stream.stream(
        core.list_namespaced_pod, namespace, resource_version=start, timeout_seconds=1
    ):
        seen.append((event["type"], event["object"].metadata.name, _rv(event["object"])))
    assert [(t, n) for t, n, _ in seen] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [rv for _, _, rv in seen]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert versions[0] > int(start)


def test_a_bookmark_is_a_version_to_resume_from(http: Http, core: Api, namespace: str) -> None:
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    created = core.create_namespaced_pod(namespace, pod_manifest("first"))
    lines = _watch_lines(
        http,
        f"/api/v1/namespaces/{namespace}/pods?watch=true&resourceVersion={start}"
        "&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    assert lines[0]["type"] == "ADDED"
    bookmarks = [line for line in lines[1:] if line["type"] == "BOOKMARK"]
    assert bookmarks, "an idle watch that allows bookmarks gets them (and one at its timeout)"
    assert len(bookmarks) == len(lines) - 1
    mark = bookmarks[-1]["object"]
    assert (mark["kind"], mark["apiVersion"]) == ("Pod", "v1")
    assert int(mark["metadata"]["resourceVersion"]) >= _rv(created)
    core.create_namespaced_pod(namespace, pod_manifest("second"))
    resumed = _watch_lines(
        http,
        f"/api/v1/namespaces/{namespace}/pods?watch=true"
        f"&resourceVersion={mark['metadata']['resourceVersion']}&timeoutSeconds=1",
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in resumed] == [("ADDED", "second")]


def test_timeout_seconds_ends_the_stream(core: Api, namespace: str) -> None:
    outcome: list[str] = []

    def follow() -> None:
        stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=1):
            outcome.append(event["type"])
        outcome.append("ended")

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    follower.join(15)
    assert not follower.is_alive()
    assert outcome == ["ended"]  # nothing in the namespace, and the server ended the stream


def test_a_watch_from_a_version_older_than_the_cache_window_is_gone(
    aged: tuple[SandboxThread, Api, Clock],
) -> None:
    _, core, clock = aged
    namespace = unique("t")
    core.create_namespace({"metadata": {"name": namespace}})
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    core.create_namespaced_pod(namespace, pod_manifest("p"))
    clock.now += DEFAULT_HISTORY_SECONDS - 1
    stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
    replayed = [
        e["type"]
        for e in stream.stream(
            core.list_namespaced_pod, namespace, resource_version=start, timeout_seconds=1
        )
    ]
    assert replayed == ["ADDED"]  # within the window the same request replays
    clock.now += 2  # the event is older than the window now
    raw = core.list_namespaced_pod(
        namespace, watch=True, resource_version=start, timeout_seconds=1, _preload_content=False
    )
    [line] = [json.loads(x) for x in raw.data.decode().splitlines() if x]
    assert line["type"] == "ERROR"
    status = line["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    with pytest.raises(client.ApiException) as caught:
        for _ in watch.Watch().stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_pod, namespace, resource_version=start, timeout_seconds=1
        ):
            pass
    assert caught.value.status == 410


def test_compaction_expires_older_versions(
    admin: SandboxAdmin, core: Api, http: Http, namespace: str
) -> None:
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    core.create_namespaced_pod(namespace, pod_manifest("p"))
    path = f"/api/v1/namespaces/{namespace}/pods?watch=true&timeoutSeconds=1&resourceVersion="
    assert [e["type"] for e in _watch_lines(http, path + start)] == ["ADDED"]
    compacted = admin.compact()
    [gone] = _watch_lines(http, path + start)
    assert (gone["type"], gone["object"]["code"], gone["object"]["reason"]) == (
        "ERROR",
        410,
        "Expired",
    )
    assert _watch_lines(http, path + compacted) == []  # from the compaction on: fine
    core.create_namespaced_pod(namespace, pod_manifest("q"))
    assert [e["object"]["metadata"]["name"] for e in _watch_lines(http, path + compacted)] == ["q"]


def test_dropping_watches_resets_their_connections(
    http: Http, sandbox: Sandbox, sandbox_call: Call, ca_file: Path, namespace: str
) -> None:
    http("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod_manifest("p"))
    pool = urllib3.PoolManager(ca_certs=str(ca_file), retries=False)
    response = pool.request(
        "GET",
        f"{sandbox.url}/api/v1/namespaces/{namespace}/pods?watch=true",
        headers={"Authorization": f"Bearer {sandbox.admin_token}"},
        preload_content=False,
        timeout=10,
    )
    assert response.status == 200
    chunks = response.stream(1 << 16)
    assert json.loads(next(chunks).splitlines()[0])["type"] == "ADDED"  # the watch is open
    assert sandbox_call(sandbox.drop_watches) >= 1
    with pytest.raises(urllib3.exceptions.ProtocolError, match="ended prematurely"):
        for _ in chunks:
            pass
    # The API is fine afterwards: the client re-watches.
    assert json.loads(http("GET", f"/api/v1/namespaces/{namespace}/pods").data)["items"]


def test_dropping_watches_gracefully_ends_their_streams(
    admin: SandboxAdmin, core: Api, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("p"))
    opened = threading.Event()
    outcome: list[str] = []

    def follow() -> None:
        stream: Api = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=60):
            outcome.append(event["type"])
            opened.set()
        outcome.append("ended")

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert opened.wait(10)
    assert admin.drop_watches(graceful=True) >= 1
    follower.join(10)
    assert not follower.is_alive(), "the stream ended long before its 60 s timeout"
    assert outcome == ["ADDED", "ended"]


def test_a_crash_cuts_every_connection_and_serving_again_keeps_port_and_store(
    tmp_path: Path,
) -> None:
    thread = SandboxThread()
    thread.start()
    try:
        sandbox = thread.sandbox
        ca = tmp_path / "ca.crt"
        ca.write_bytes(sandbox.ca.ca_pem)
        core: Api = client.CoreV1Api(api_client(sandbox.url, ca, sandbox.admin_token))
        core.create_namespaced_pod("default", pod_manifest("kept"))
        pool = urllib3.PoolManager(ca_certs=str(ca), retries=False)
        headers = {"Authorization": f"Bearer {sandbox.admin_token}"}
        watching = pool.request(
            "GET",
            f"{sandbox.url}/api/v1/namespaces/default/pods?watch=true",
            headers=headers,
            preload_content=False,
            timeout=10,
        )
        chunks = watching.stream(1 << 16)
        assert json.loads(next(chunks).splitlines()[0])["type"] == "ADDED"  # the watch is open
        thread.run(sandbox.crash())
        with pytest.raises(urllib3.exceptions.ProtocolError):
            for _ in chunks:
                pass
        with pytest.raises(urllib3.exceptions.NewConnectionError, match="refused"):
            pool.request("GET", f"{sandbox.url}/version", headers=headers, timeout=5)
        thread.run(sandbox.serve_again())
        assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["kept"]
    finally:
        thread.stop()


# -- lists -------------------------------------------------------------------------------------


def test_every_page_is_served_from_the_first_page_snapshot(core: Api, namespace: str) -> None:
    for i in range(6):
        core.create_namespaced_pod(namespace, pod_manifest(f"p{i}", {"v": "1"}))
    first = core.list_namespaced_pod(namespace, limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    core.delete_namespaced_pod("p3", namespace, grace_period_seconds=0)
    core.create_namespaced_pod(namespace, pod_manifest("p25"))
    core.patch_namespaced_pod("p4", namespace, {"metadata": {"labels": {"v": "2"}}})
    pages = [first]
    while pages[-1].metadata._continue:
        pages.append(
            core.list_namespaced_pod(namespace, limit=2, _continue=pages[-1].metadata._continue)
        )
    names = [p.metadata.name for page in pages for p in page.items]
    assert names == [f"p{i}" for i in range(6)]
    assert [p.metadata.labels["v"] for page in pages for p in page.items] == ["1"] * 6
    assert {page.metadata.resource_version for page in pages} == {first.metadata.resource_version}
    assert pages[1].metadata.remaining_item_count == 2
    fresh = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    assert fresh == ["p0", "p1", "p2", "p25", "p4", "p5"]


def test_a_compaction_expires_continue_tokens(
    admin: SandboxAdmin, core: Api, namespace: str
) -> None:
    for i in range(4):
        core.create_namespaced_pod(namespace, pod_manifest(f"p{i}"))
    first = core.list_namespaced_pod(namespace, limit=2)
    admin.compact()
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod(namespace, limit=2, _continue=first.metadata._continue)
    assert caught.value.status == 410
    body = status_of(caught.value)
    assert (body["reason"], body["code"], body["message"]) == ("Expired", 410, CONTINUE_EXPIRED)
    # The token in the Status goes on from the live data.
    rest = core.list_namespaced_pod(namespace, limit=2, _continue=body["metadata"]["continue"])
    assert [p.metadata.name for p in rest.items] == ["p2", "p3"]


def test_a_continue_token_expires_with_time(aged: tuple[SandboxThread, Api, Clock]) -> None:
    thread, core, clock = aged
    namespace = unique("t")
    thread.call(thread.sandbox.registry.create, NAMESPACES, {"metadata": {"name": namespace}})
    for i in range(4):
        core.create_namespaced_pod(namespace, pod_manifest(f"p{i}"))
    prompt = core.list_namespaced_pod(namespace, limit=2)
    clock.now += DEFAULT_CONTINUE_TTL_SECONDS - 1
    again = core.list_namespaced_pod(namespace, limit=2, _continue=prompt.metadata._continue)
    assert [p.metadata.name for p in again.items] == ["p2", "p3"]  # in time, the token works
    late = core.list_namespaced_pod(namespace, limit=2)
    clock.now += DEFAULT_CONTINUE_TTL_SECONDS + 1
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod(namespace, limit=2, _continue=late.metadata._continue)
    assert caught.value.status == 410
    assert status_of(caught.value)["message"] == CONTINUE_EXPIRED
