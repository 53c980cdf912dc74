"""What an agent reports of its node's image cache (the pool's `cache.enabled`), against a real
registry, real skopeo and umoci, and the real gRPC gateway service: the references pulled as the
cached images, as Docker reads them, most recently used first; an evicted image's are gone; the
heartbeats carry them when they change (and on the first beat after registering), not on every
beat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc import aio

from levers9.agent.gateway import GatewayClient, Registration
from levers9.agent.images import ImageCache
from levers9.proto import gateway_pb2
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox
from tests.agent.recording_gateway import RecordingGateway

pytestmark = pytest.mark.integration

TOKEN = "l9w_cache-report-test-token"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        layout = tmp_path_factory.mktemp("build") / "layout"
        for name in ("one", "two"):
            build_busybox(layout, name, marker=name)
            push_layout(layout, f"{running.address}/tasks/busybox:{name}", name)
        yield running


def _cache(root: Path, registry: LocalRegistry, max_bytes: int = 10**12) -> ImageCache:
    return ImageCache(root, insecure=[registry.address], max_bytes=max_bytes)


async def test_references_most_recently_used_first(registry: LocalRegistry, tmp_path: Path) -> None:
    cache = _cache(tmp_path, registry)
    one, two = (f"{registry.address}/tasks/busybox:{n}" for n in ("one", "two"))
    assert cache.references() == []
    first = await cache.pull(one)
    await cache.pull(two)
    assert cache.references() == [two, one]
    await cache.pull(one)  # from the cache: used again
    assert cache.references() == [one, two]
    pinned = f"{registry.address}/tasks/busybox@{first.digest}"
    await cache.pull(pinned)  # the same digest, under a second reference
    assert cache.references() == [pinned, one, two]
    assert cache.references(limit=2) == [pinned, one]
    # Another agent on the node's cache (a new worker) reads the same.
    assert _cache(tmp_path, registry).references() == [pinned, one, two]


async def test_an_evicted_images_references_go(registry: LocalRegistry, tmp_path: Path) -> None:
    one, two = (f"{registry.address}/tasks/busybox:{n}" for n in ("one", "two"))
    sizing = _cache(tmp_path / "sizing", registry)
    await sizing.pull(one)
    cache = _cache(tmp_path / "cache", registry, max_bytes=sizing.size() * 3 // 2)
    await cache.pull(one)
    await cache.pull(two)  # past the cap: `one` goes
    assert cache.references() == [two]


async def test_heartbeats_carry_the_cache_when_it_changes(
    registry: LocalRegistry, tmp_path: Path
) -> None:
    cache = _cache(tmp_path, registry)
    one, two = (f"{registry.address}/tasks/busybox:{n}" for n in ("one", "two"))
    await cache.pull(one)
    registration = Registration("node-a", "uid", "127.0.0.1:1", (0,), "", "test")

    class Idle:
        running = 0
        idle_since = None

    def reports(heartbeats: list[gateway_pb2.HeartbeatRequest]) -> list[list[str]]:
        return [list(b.cached_images) for b in heartbeats if b.cache_reported]

    async with RecordingGateway() as gateway, aio.insecure_channel(gateway.address) as channel:
        client = GatewayClient(channel, TOKEN, "pool", "w1", cache=cache.references)
        running = asyncio.create_task(client.run(registration, Idle()))
        try:
            await gateway.wait_for(lambda calls: len(calls.heartbeats) >= 3)
            # The first beat says what the cache holds; the next ones, unchanged, do not.
            assert reports(gateway.calls.heartbeats) == [[one]]
            assert gateway.calls.heartbeats[0].cache_reported
            await cache.pull(two)
            await gateway.wait_for(lambda calls: len(reports(calls.heartbeats)) == 2)
            assert reports(gateway.calls.heartbeats)[-1] == [two, one]
            # A gateway that forgot the worker: registered again, its first beat reports again.
            await gateway.restart()
            await gateway.wait_for(lambda calls: len(reports(calls.heartbeats)) == 3)
            assert reports(gateway.calls.heartbeats)[-1] == [two, one]
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    # Without a cache to report (the pool's cache off), no beat says anything of one.
    async with RecordingGateway() as gateway, aio.insecure_channel(gateway.address) as channel:
        client = GatewayClient(channel, TOKEN, "pool", "w2")
        running = asyncio.create_task(client.run(registration, Idle()))
        try:
            await gateway.wait_for(lambda calls: len(calls.heartbeats) >= 2)
            assert reports(gateway.calls.heartbeats) == []
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
