"""The worker image of the sandbox: a small but real OCI image, built here without a daemon.

What the spec's cloud side does with the worker image is copy it, from the controlplane's ECR
into the cluster project's Artifact Registry, and what GKE does is pull it. Both only need an
image a registry accepts and serves; what is inside matters to no one in the sandbox (its
kubelet runs the worker as a local process, the scenario's `images.process`). So the image is
built in Python as an OCI image layout (the format `skopeo copy oci:<dir>:<tag>` reads): one
gzip tar layer holding `/opt/levers9/VERSION`, an image config whose ENTRYPOINT is
`levers9-worker` and whose `org.opencontainers.image.version` label is the package version, a
manifest, and `index.json` naming it `latest`.

The build is byte-for-byte reproducible (fixed timestamps and owners, gzip without a name or
time), so one package version always has one digest: `levers9 dev up` pushes only when the
registry's digest differs, and a rerun pushes nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from sandbox import registries

PACKAGE = "levers9-pools"
REPOSITORY = "levers9/worker"
TAG = "latest"
ENTRYPOINT = "levers9-worker"
CREATED = "2026-01-01T00:00:00Z"
"""Fixed, so the config (and with it the digest) depends on the content only."""

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "0.0.0+local"


@dataclass(frozen=True)
class WorkerImage:
    layout: Path
    """The OCI image layout directory (`oci:<layout>:latest` for skopeo)."""
    digest: str
    """The manifest's digest: what a registry reports once it holds this image."""
    version: str


def _layer_tar(version: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("opt", "opt/levers9"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        data = f"{version}\n".encode()
        info = tarfile.TarInfo("opt/levers9/VERSION")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(blobs: Path, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def build(directory: Path, version: str | None = None) -> WorkerImage:
    """Writes the worker image's OCI layout to `directory` (replacing what is there)."""
    version = version or package_version()
    shutil.rmtree(directory, ignore_errors=True)
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tar = _layer_tar(version)
    layer = _blob(blobs, gzip.compress(tar, mtime=0), OCI_LAYER)
    labels = {
        "org.opencontainers.image.title": "levers9-worker",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.description": "the levers9 worker (sandbox build)",
    }
    config = {
        "created": CREATED,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [ENTRYPOINT],
            "Env": ["PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
        "history": [{"created": CREATED, "created_by": "sandbox.worker_image"}],
    }
    config_blob = _blob(blobs, _canonical(config), OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_blob,
        "layers": [layer],
        "annotations": {"org.opencontainers.image.version": version},
    }
    described = _blob(blobs, _canonical(manifest), OCI_MANIFEST)
    described["annotations"] = {"org.opencontainers.image.ref.name": TAG}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
    index["manifests"] = [described]
    (directory / "index.json").write_bytes(_canonical(index))
    (directory / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
    return WorkerImage(directory, described["digest"], version)


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def push(image: WorkerImage, registry_address: str, repository: str = REPOSITORY) -> str:
    """Pushes `image` as `<registry>/<repository>:latest` unless the registry already serves
    that digest; returns the digest the registry serves."""
    reference = f"{registry_address}/{repository}:{TAG}"
    if registries.manifest_digest(registry_address, repository, TAG) == image.digest:
        return image.digest
    return registries.push_layout(image.layout, reference, TAG)
