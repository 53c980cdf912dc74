"""The sandbox's registries and worker image: a real distribution registry on loopback answers
`/v2/`, the worker image built in Python is a valid OCI image (one layer with
`/opt/levers9/VERSION`, ENTRYPOINT `levers9-worker`, the version label) and reproducible,
skopeo pushes it and reports the registry's digest, a second push sends nothing, a copy between
the two registries (ECR -> Artifact Registry) keeps the digest, a delete takes it away again,
and nothing but loopback is ever a target.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import registries, worker_image
from sandbox.registries import LocalRegistry, RegistryError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ecr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("ecr")) as registry:
        yield registry


@pytest.fixture(scope="module")
def gar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("gar")) as registry:
        yield registry


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> worker_image.WorkerImage:
    return worker_image.build(tmp_path_factory.mktemp("layout") / "worker")


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def test_the_registry_answers_on_loopback(ecr: LocalRegistry) -> None:
    assert ecr.address.startswith("127.0.0.1:")
    assert registries.ready(ecr.address)
    config = json.loads((ecr.directory / "config.yml").read_text())
    assert config["http"]["addr"] == ecr.address
    assert config["storage"]["filesystem"]["rootdirectory"] == str(ecr.directory / "data")


def test_a_stopped_registry_is_not_ready(tmp_path: Path) -> None:
    registry = LocalRegistry(tmp_path).start()
    registry.stop()
    assert not registries.ready(registry.address)


def test_the_worker_image_is_a_real_oci_image(image: worker_image.WorkerImage) -> None:
    index = json.loads((image.layout / "index.json").read_text())
    [entry] = index["manifests"]
    assert entry["digest"] == image.digest
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "latest"
    manifest = json.loads(_blob(image.layout, image.digest))
    assert manifest["mediaType"] == worker_image.OCI_MANIFEST
    config = json.loads(_blob(image.layout, manifest["config"]["digest"]))
    assert config["config"]["Entrypoint"] == ["levers9-worker"]
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == worker_image.package_version()
    [layer] = manifest["layers"]
    tar = gzip.decompress(_blob(image.layout, layer["digest"]))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        version = archive.extractfile("opt/levers9/VERSION")
        assert version is not None
        assert version.read().decode().strip() == image.version
    # skopeo reads the layout as an image, config included.
    inspected = subprocess.run(
        ["skopeo", "inspect", "--config", f"oci:{image.layout}:latest"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(inspected.stdout)["config"]["Entrypoint"] == ["levers9-worker"]


def test_the_build_is_reproducible(image: worker_image.WorkerImage, tmp_path: Path) -> None:
    assert worker_image.build(tmp_path / "again").digest == image.digest
    assert worker_image.build(tmp_path / "other", version="9.9.9").digest != image.digest


def test_push_reports_the_registry_digest(
    ecr: LocalRegistry, image: worker_image.WorkerImage
) -> None:
    digest = worker_image.push(image, ecr.address)
    assert digest == image.digest
    reference = f"{ecr.address}/levers9/worker:latest"
    assert registries.inspect_digest(reference) == digest
    assert registries.manifest_digest(ecr.address, "levers9/worker", "latest") == digest
    assert registries.has_manifest(ecr.address, "levers9/worker", digest)
    assert not registries.has_manifest(ecr.address, "levers9/worker", "v0")
    assert not registries.has_manifest(ecr.address, "levers9/nothing", "latest")


def test_a_second_push_sends_nothing(
    ecr: LocalRegistry, image: worker_image.WorkerImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_image.push(image, ecr.address)

    def no_copy(*args: object) -> str:
        raise AssertionError("the registry already serves this digest")

    monkeypatch.setattr(registries, "push_layout", no_copy)
    assert worker_image.push(image, ecr.address) == image.digest


def test_copy_between_registries_then_delete(
    ecr: LocalRegistry, gar: LocalRegistry, image: worker_image.WorkerImage
) -> None:
    worker_image.push(image, ecr.address)
    target = f"{gar.address}/demo/levers9/worker:latest"
    assert registries.copy_image(f"{ecr.address}/levers9/worker:latest", target) == image.digest
    assert registries.has_manifest(gar.address, "demo/levers9/worker", "latest")
    registries.delete_image(target)
    assert not registries.has_manifest(gar.address, "demo/levers9/worker", "latest")


def test_only_loopback_is_a_target(image: worker_image.WorkerImage) -> None:
    for address in ("10.0.0.1:5000", "registry.example.com:443", "us-central1-docker.pkg.dev"):
        with pytest.raises(RegistryError, match="loopback"):
            registries.require_loopback(address)
    with pytest.raises(RegistryError, match="loopback"):
        registries.push_layout(image.layout, "us-central1-docker.pkg.dev/demo/levers9/worker:x")
    with pytest.raises(RegistryError, match="loopback"):
        registries.manifest_digest("192.0.2.1:5000", "levers9/worker", "latest")
    assert registries.require_loopback("127.0.0.1:5000") == "127.0.0.1:5000"


def test_a_missing_tool_names_its_package() -> None:
    with pytest.raises(RegistryError, match=r"apt-get install -y some-package"):
        registries._tool("levers9-no-such-tool", "some-package")
