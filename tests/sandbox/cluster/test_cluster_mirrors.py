"""Registry mirrors: an image whose host is mirrored to a real registry on loopback pulls
exactly when that registry holds it (`images.present` is not consulted for it): absent, the pod
shows containerd's `not found` as ErrImagePull, then ImagePullBackOff; copied there, it pulls on
the next retry; a registry that does not answer gives a connection error. Mirrors must be on
loopback, and `--registry-mirror` adds them to the scenario.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import registries, worker_image
from sandbox.cluster.images import ImageSet
from sandbox.registries import LocalRegistry
from sandbox.resources import PODS
from sandbox.scenario import Scenario
from tests.sandbox.cluster.kit import CPU_NODE, MakeCluster, fast_scenario, phase, pod, wait_for

pytestmark = pytest.mark.integration

HOST = "us-central1-docker.pkg.dev"
IMAGE = f"{HOST}/demo/levers9/server:1"


@pytest.fixture
def gar(tmp_path: Path) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path / "gar") as registry:
        yield registry


def _waiting(found: dict[str, Any] | None) -> dict[str, str]:
    statuses = (found or {}).get("status", {}).get("containerStatuses") or [{}]
    waiting: dict[str, str] = statuses[0].get("state", {}).get("waiting") or {}
    return waiting


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": CPU_NODE,
            "restartPolicy": "Always",
            "containers": [{"name": "main", "image": image}],
        },
    }


async def test_a_mirrored_image_pulls_once_the_registry_has_it(
    make_cluster: MakeCluster, gar: LocalRegistry, tmp_path: Path
) -> None:
    scenario = fast_scenario().with_registry_mirrors({HOST: gar.address})
    cluster = await make_cluster(scenario)
    assert cluster.images.mirrors == {HOST: gar.address}
    registry = cluster.registry
    registry.create(PODS, _pod("server", IMAGE))
    await wait_for(lambda: _waiting(pod(registry, "server")).get("reason") == "ErrImagePull")
    message = _waiting(pod(registry, "server"))["message"]
    assert message == (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": '
        f'failed to resolve reference "{IMAGE}": {IMAGE}: not found'
    )
    await wait_for(lambda: _waiting(pod(registry, "server")).get("reason") == "ImagePullBackOff")
    image = worker_image.build(tmp_path / "layout")
    registries.push_layout(image.layout, f"{gar.address}/demo/levers9/server:1")
    await wait_for(lambda: phase(registry, "server", "Running"))


async def test_present_does_not_count_for_a_mirrored_host(
    make_cluster: MakeCluster, gar: LocalRegistry
) -> None:
    worker = f"{HOST}/demo/levers9/worker:latest"
    scenario = fast_scenario().with_registry_mirrors({HOST: gar.address})
    assert worker in scenario.images.present
    cluster = await make_cluster(scenario)
    assert await cluster.images.pull_error(worker) is not None
    assert await cluster.images.pull_error("vllm/vllm-openai:v0.10.1") is None


async def test_an_unanswering_mirror_is_a_connection_error() -> None:
    port = registries.free_port()
    images = ImageSet(mirrors={HOST: f"127.0.0.1:{port}"})
    error = await images.pull_error(IMAGE)
    assert error is not None
    assert f'Head "https://{HOST}/v2/demo/levers9/server/manifests/1"' in error
    assert "connection refused" in error


def test_mirrors_are_loopback_only() -> None:
    base = Scenario.load()
    with pytest.raises(ValueError, match="loopback"):
        base.with_registry_mirrors({HOST: "10.1.2.3:5000"})
    with pytest.raises(ValueError, match=r"HOST=127\.0\.0\.1:PORT"):
        base.with_registry_mirrors({HOST: "127.0.0.1"})
    with pytest.raises(ValueError, match="loopback"):
        ImageSet(mirrors={HOST: "192.0.2.1:5000"})
    mirrored = base.with_registry_mirrors({HOST: "127.0.0.1:5051"})
    assert mirrored.images.mirrors == {HOST: "127.0.0.1:5051"}
    assert mirrored.images.present == base.images.present
