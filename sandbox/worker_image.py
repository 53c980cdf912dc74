"""The worker image of the sandbox: a small but real OCI image, built here without a daemon.

What the spec's cloud side does with the worker image is copy it, from the controlplane's ECR
into the cluster project's Artifact Registry, and what GKE does is pull it. The sandbox's kubelet
runs the worker itself as a local process (the scenario's `images.process`), but a task that
names no image on a pool without `taskDefaults.image` runs in a container of the worker's own
image: so the dev stack builds it on the Python task image (`base`: sandbox/task_images.py's
layout, mmdebstrap's Debian with python3, cached per machine), where `python3 -c`, `sh -c` and
`sleep` run. Built in Python as an OCI image layout (the format `skopeo copy oci:<dir>:<tag>`
reads): the base's layers (hard-linked), one gzip tar layer holding `/opt/levers9/VERSION`, an
image config whose ENTRYPOINT is `levers9-worker` (which the agent never runs for a task: a
task's command runs as given) and whose `org.opencontainers.image.version` label is the package
version, a manifest, and `index.json` naming it `latest`. Without `base` (tests of the registries,
where what is inside matters to no one) it is that one layer alone.

The build is byte-for-byte reproducible (fixed timestamps and owners, gzip without a name or
time, the base's blobs as they are), so one package version on one base always has one digest:
`levers9 dev up` pushes only when the registry's digest differs, and a rerun pushes nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
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


def build(directory: Path, version: str | None = None, base: Path | None = None) -> WorkerImage:
    """Writes the worker image's OCI layout to `directory` (replacing what is there), on the
    OCI layout `base` (its one image: sandbox.task_images.python_image's) when given."""
    version = version or package_version()
    shutil.rmtree(directory, ignore_errors=True)
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers, diff_ids, env = _base(base, blobs) if base is not None else ([], [], [])
    tar = _layer_tar(version)
    layers.append(_blob(blobs, gzip.compress(tar, mtime=0), OCI_LAYER))
    diff_ids.append(f"sha256:{hashlib.sha256(tar).hexdigest()}")
    labels = {
        "org.opencontainers.image.title": "levers9-worker",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.description": "the levers9 worker (sandbox build)",
    }
    path = "PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    config = {
        "created": CREATED,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [ENTRYPOINT],
            "Env": [path, *(e for e in env if not e.startswith("PATH="))],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": CREATED, "created_by": "sandbox.worker_image"}],
    }
    config_blob = _blob(blobs, _canonical(config), OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_blob,
        "layers": layers,
        "annotations": {"org.opencontainers.image.version": version},
    }
    described = _blob(blobs, _canonical(manifest), OCI_MANIFEST)
    described["annotations"] = {"org.opencontainers.image.ref.name": TAG}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
    index["manifests"] = [described]
    (directory / "index.json").write_bytes(_canonical(index))
    (directory / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
    return WorkerImage(directory, described["digest"], version)


def _base(layout: Path, blobs: Path) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The layers (descriptors), their diff ids and the Env of the one image in `layout`, its
    layer blobs linked into `blobs`."""
    source = layout / "blobs" / "sha256"
    [described] = json.loads((layout / "index.json").read_text())["manifests"]
    manifest = json.loads(_read_blob(source, described["digest"]))
    config = json.loads(_read_blob(source, manifest["config"]["digest"]))
    layers: list[dict[str, Any]] = []
    for layer in manifest["layers"]:
        name = layer["digest"].removeprefix("sha256:")
        try:
            os.link(source / name, blobs / name)
        except OSError:  # another filesystem
            shutil.copyfile(source / name, blobs / name)
        layers.append({k: layer[k] for k in ("mediaType", "digest", "size")})
    env = list(config.get("config", {}).get("Env") or [])
    return layers, list(config["rootfs"]["diff_ids"]), env


def _read_blob(blobs: Path, digest: str) -> bytes:
    return (blobs / digest.removeprefix("sha256:")).read_bytes()


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def push(image: WorkerImage, registry_address: str, repository: str = REPOSITORY) -> str:
    """Pushes `image` as `<registry>/<repository>:latest` unless the registry already serves
    that digest; returns the digest the registry serves."""
    reference = f"{registry_address}/{repository}:{TAG}"
    if registries.manifest_digest(registry_address, repository, TAG) == image.digest:
        return image.digest
    return registries.push_layout(image.layout, reference, TAG)
