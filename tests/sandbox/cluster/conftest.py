"""Fixtures for the simulated cluster: a registry and a `Cluster` on it, in-process, driven
through the registry as controllers and clients drive the API, with a fast scenario and a
state directory per test. These tests need no HTTP emulator, so the package-wide fixture
that resets the emulator's access policy is replaced by a no-op here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from sandbox.cluster import Cluster
from sandbox.registry import Registry
from sandbox.scenario import Scenario
from tests.sandbox.cluster.kit import MakeCluster, fast_scenario


@pytest.fixture(autouse=True)
def _fresh_access() -> None:
    """Replaces the package's emulator reset: nothing here touches the HTTP emulator."""


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[MakeCluster]:
    """Starts clusters on fresh registries; stops every one of them after the test."""
    async with AsyncExitStack() as stack:

        async def make(scenario: Scenario) -> Cluster:
            cluster = Cluster(Registry(), scenario, tmp_path / f"state{len(made)}")
            made.append(cluster)
            return await stack.enter_async_context(cluster)

        made: list[Cluster] = []
        yield make


@pytest.fixture
async def cluster(make_cluster: MakeCluster) -> Cluster:
    """The default scenario (model-server included), fast."""
    return await make_cluster(fast_scenario())


@pytest.fixture
def registry(cluster: Cluster) -> Registry:
    return cluster.registry
