"""Real OCI registries on loopback: the sandbox's stand-ins for ECR and Artifact Registry.

The spec's "the worker image is pullable from that project" and its day-two "copy it again" are
about real image copies between two registries (the controlplane's ECR, the cluster project's
`<region>-docker.pkg.dev`). An emulator of the Registry API would test our copy against our own
reading of the protocol; Debian's `docker-registry` (the CNCF distribution registry, the same
code Docker Hub and most private registries run) and `skopeo` (the copy tool, speaking that
protocol for real) test it against the real thing. So the sandbox runs one distribution
registry per cloud registry, each a child process on 127.0.0.1 with its storage under a
directory of its own, plain HTTP (loopback only; the copy passes `--dest-tls-verify=false` as
one does for an insecure registry).

    with LocalRegistry(tmp / "ecr") as ecr:        # port 0: a free one is picked
        digest = push_layout(layout, f"{ecr.address}/levers9/worker:latest")
        has_manifest(ecr.address, "levers9/worker", "latest")   # HEAD /v2/.../manifests/...

`levers9 dev up` runs the same registry through `registry_argv` and `write_config`, with its
own process records; `LocalRegistry` is the self-contained form for tests and scripts.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from sandbox.child import ChildProcess, ChildServer

HOST = "127.0.0.1"
REGISTRY_PACKAGE = "docker-registry"
SKOPEO_PACKAGE = "skopeo"
INSTALL_HINT = "deploy/dev/install-tools.sh installs it (Debian: apt-get install -y {package})"
PROBE_TIMEOUT_S = 5.0
COPY_TIMEOUT_S = 120.0

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
"""What a pull accepts: without an Accept header distribution answers 404 for an OCI manifest."""


class RegistryError(Exception):
    """A registry or copy that cannot run, with what to do about it."""


def _tool(name: str, package: str) -> str:
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
    )
    if found is None:
        raise RegistryError(f"{name} is not installed; " + INSTALL_HINT.format(package=package))
    return found


def registry_binary() -> str:
    """Debian's distribution registry (`/usr/bin/docker-registry`)."""
    return _tool("docker-registry", REGISTRY_PACKAGE)


def skopeo_binary() -> str:
    return _tool("skopeo", SKOPEO_PACKAGE)


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (the registry itself cannot report port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def require_loopback(address: str) -> str:
    """`address` (`host:port`) when its host is a loopback IP; the sandbox dials nothing else."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise RegistryError(f"{address} is not a loopback address; the sandbox dials loopback only")
    return address


def write_config(directory: Path, port: int) -> Path:
    """The registry's `config.yml` under `directory`, storage in `directory/data`.

    JSON is YAML, so the file is written with `json`. Deletes are enabled so a test can take an
    image away again (the "image not in the project's registry" symptom).
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str((directory / "data").absolute())},
            "delete": {"enabled": True},
        },
        "http": {"addr": f"{HOST}:{port}", "secret": secrets.token_urlsafe(24)},
    }
    path = directory / "config.yml"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def registry_argv(config: Path) -> list[str]:
    return [registry_binary(), "serve", str(config.absolute())]


def _request(
    method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as answer:
            return answer.status, dict(answer.headers.items())
    except urllib.error.HTTPError as error:
        return error.code, {}


def ready(address: str) -> bool:
    """True once `GET /v2/` answers 200 (the registry's API base, no auth here)."""
    try:
        return _request("GET", f"http://{require_loopback(address)}/v2/")[0] == 200
    except (urllib.error.URLError, OSError):
        return False


def manifest_digest(address: str, repository: str, reference: str) -> str | None:
    """`HEAD /v2/<repository>/manifests/<tag or digest>`: the digest the registry serves for
    it (`Docker-Content-Digest`), None when it holds no such image or does not answer."""
    url = f"http://{require_loopback(address)}/v2/{repository}/manifests/{reference}"
    try:
        status, headers = _request("HEAD", url, {"Accept": ", ".join(MANIFEST_TYPES)})
    except (urllib.error.URLError, OSError):
        return None
    if status != 200:
        return None
    return headers.get("Docker-Content-Digest") or reference


def has_manifest(address: str, repository: str, reference: str) -> bool:
    """Does the registry hold the image `<repository>:<reference>` (a tag or a digest)?"""
    return manifest_digest(address, repository, reference) is not None


def _skopeo(*args: str) -> str:
    result = subprocess.run(
        [skopeo_binary(), "--insecure-policy", *args],
        capture_output=True,
        text=True,
        timeout=COPY_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise RegistryError(f"skopeo {args[0]} failed: {result.stderr.strip()}")
    return result.stdout


def _docker_ref(reference: str) -> str:
    """`docker://<reference>`, the reference's registry being a loopback one."""
    require_loopback(reference.split("/", 1)[0])
    return f"docker://{reference}"


def inspect_digest(reference: str) -> str:
    """The manifest digest a registry serves for `reference` (`127.0.0.1:port/repo:tag`)."""
    info = json.loads(_skopeo("inspect", "--tls-verify=false", _docker_ref(reference)))
    digest: str = info["Digest"]
    return digest


def push_layout(layout: Path, reference: str, tag: str = "latest") -> str:
    """Copies the OCI layout's image `tag` to `reference`; returns the pushed digest."""
    _skopeo(
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        f"oci:{layout.absolute()}:{tag}",
        _docker_ref(reference),
    )
    return inspect_digest(reference)


def copy_image(source: str, destination: str) -> str:
    """Registry to registry (both loopback, both plain HTTP), as the attach script's copy does
    between ECR and Artifact Registry; returns the destination's digest."""
    _skopeo(
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        _docker_ref(source),
        _docker_ref(destination),
    )
    return inspect_digest(destination)


def delete_image(reference: str) -> None:
    """Removes `reference` from its registry (the image gone from the project's registry)."""
    _skopeo("delete", "--tls-verify=false", _docker_ref(reference))


class LocalRegistry(ChildServer):
    """One distribution registry as a child process of this one (tests, scripts)."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.address = f"{HOST}:{self.port}"
        self.child = ChildProcess(
            f"the registry on {self.address}", directory / "registry.log", RegistryError
        )

    @property
    def log(self) -> Path:
        return self.child.log

    def start(self) -> LocalRegistry:
        config = write_config(self.directory, self.port)
        self.child.spawn(registry_argv(config), lambda: ready(self.address))
        return self
