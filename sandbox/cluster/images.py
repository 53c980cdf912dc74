"""The images the sandbox's registries hold, which of them the kubelet runs as processes, and
the kubelet's image manager that pulls them.

A reference is compared in its normalized form (`python` is `docker.io/library/python:latest`)
so a pod may name an image either way, as with containerd. "Present" means pullable: a pod
whose image is absent goes `ErrImagePull` → `ImagePullBackOff` until the image is added
(`Cluster.add_image`, or the registry emulator copying it), then pulls on its next retry.

A registry host may be mirrored (`images.mirrors`, or `levers9 sandbox serve --registry-mirror
HOST=127.0.0.1:PORT`, which `levers9 dev up` passes for the project's Artifact Registry): an
image on that host is then pullable exactly when the real registry standing in for it, on
loopback, answers `HEAD /v2/<repository>/manifests/<tag>`, so copying the worker image there
(skopeo, as the attach script does) is what makes a pod start, and a registry without it gives
the pod the containerd error a GKE node shows. `present` is for the other hosts only.

A process image names what the kubelet executes when a container gives no `command`: its
`entrypoint` (the image's ENTRYPOINT) and `cmd` (CMD, replaced by the container's `args`).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from sandbox.cluster.events import EventRecorder
from sandbox.scenario import Timing

_DEFAULT_DOMAIN = "docker.io"
MIRROR_TIMEOUT_S = 5.0
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


def normalize(reference: str) -> str:
    """containerd's normalized name: registry domain, `library/` for official images, and
    `:latest` when neither tag nor digest is given."""
    ref = reference.strip()
    first, slash, _ = ref.partition("/")
    if not slash:
        ref = f"{_DEFAULT_DOMAIN}/library/{ref}"
    elif not ("." in first or ":" in first or first == "localhost"):
        ref = f"{_DEFAULT_DOMAIN}/{ref}"
    last = ref.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        ref += ":latest"
    return ref


def split(reference: str) -> tuple[str, str, str]:
    """(registry host, repository, tag or digest) of a reference, normalized first."""
    host, _, rest = normalize(reference).partition("/")
    if "@" in rest:
        repository, _, tag = rest.partition("@")
    else:
        repository, _, tag = rest.rpartition(":")
    return host, repository, tag


def not_found(reference: str) -> str:
    """containerd's message for an image its registry does not hold."""
    ref = normalize(reference)
    return (
        f"rpc error: code = NotFound desc = failed to pull and unpack image "
        f'"{ref}": failed to resolve reference "{ref}": {ref}: not found'
    )


def image_id(reference: str) -> str:
    """A repo digest for the status' `imageID` (stable per reference)."""
    name = normalize(reference)
    repository = name.split("@", 1)[0]
    last = repository.rsplit("/", 1)
    if ":" in last[-1]:
        repository = repository.rsplit(":", 1)[0]
    digest = hashlib.sha256(name.encode()).hexdigest()
    return f"{repository}@sha256:{digest}"


@dataclass(frozen=True)
class ProcessImage:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def argv(self, command: Sequence[str], args: Sequence[str] | None) -> list[str]:
        """The OCI rule: `command` replaces ENTRYPOINT (and drops CMD), `args` replaces CMD."""
        if command:
            return [*command, *(args or ())]
        return [*self.entrypoint, *(self.cmd if args is None else args)]


PROCESS_TASKS_ENV = {"LEVERS9_PROCESS_TASKS": "true"}
"""What the kubelet adds to a process container's environment under `images.processTasks`."""


class ImageSet:
    """Which images can be pulled, how long a pull takes, which run as local processes."""

    def __init__(
        self,
        present: Iterable[str] = (),
        process: Mapping[str, ProcessImage] | None = None,
        pull_seconds: float = 0.0,
        mirrors: Mapping[str, str] | None = None,
        process_tasks: bool = False,
    ) -> None:
        self.process_tasks = process_tasks
        """The scenario's `images.processTasks`: process containers get `PROCESS_TASKS_ENV`."""
        self._present = {normalize(r) for r in present}
        self._process = {normalize(r): p for r, p in (process or {}).items()}
        self.pull_seconds = pull_seconds
        for address in (mirrors or {}).values():
            if not ipaddress.ip_address(address.rpartition(":")[0].strip("[]")).is_loopback:
                raise ValueError(f"registry mirror {address} is not on loopback")
        self.mirrors = dict(mirrors or {})
        """Registry host -> `127.0.0.1:<port>` of the real registry that stands in for it."""

    def add(self, reference: str) -> None:
        self._present.add(normalize(reference))

    def remove(self, reference: str) -> None:
        self._present.discard(normalize(reference))

    def has(self, reference: str) -> bool:
        return normalize(reference) in self._present

    async def pull_error(self, reference: str) -> str | None:
        """None when `reference` can be pulled now, else containerd's error for the pull."""
        host, repository, tag = split(reference)
        mirror = self.mirrors.get(host)
        if mirror is None:
            return None if self.has(reference) else not_found(reference)
        url = f"http://{mirror}/v2/{repository}/manifests/{tag}"
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=MIRROR_TIMEOUT_S)
                ) as session,
                session.head(url, headers={"Accept": ", ".join(MANIFEST_TYPES)}) as answer,
            ):
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as error:
            ref = normalize(reference)
            if isinstance(error, aiohttp.ClientConnectorError):
                cause = f"dial tcp {mirror}: connect: connection refused"
            elif isinstance(error, TimeoutError):
                cause = f"dial tcp {mirror}: i/o timeout"
            else:
                cause = str(error)
            return (
                f"rpc error: code = Unknown desc = failed to pull and unpack image "
                f'"{ref}": failed to resolve reference "{ref}": failed to do request: '
                f'Head "https://{host}/v2/{repository}/manifests/{tag}": {cause}'
            )
        if status == 200:
            return None
        return not_found(reference)

    def process_image(self, reference: str) -> ProcessImage | None:
        return self._process.get(normalize(reference))

    def present(self) -> list[str]:
        return sorted(self._present)


class ImagePuller:
    """One node's image manager: each image is pulled once (then "already present on
    machine"), a failed pull backs off doubling from `image_pull_backoff_seconds`, and every
    step leaves the Events `kubectl describe pod` shows."""

    def __init__(self, images: ImageSet, events: EventRecorder, timing: Timing) -> None:
        self._images = images
        self._events = events
        self._timing = timing
        self.pulled: set[str] = set()

    async def pull(
        self,
        pod: Mapping[str, Any],
        image: str,
        policy: str,
        waiting: Callable[[str, str], None],
        sleep: Callable[[float], Awaitable[bool]],
    ) -> str | None:
        """The image's id once pulled; None when `sleep` says the pod is stopping.

        `waiting(reason, message)` shows the container waiting; `sleep(s)` waits and returns
        True when the pod was told to stop meanwhile.
        """
        events = self._events
        attempt = 0
        while True:
            cached = normalize(image) in self.pulled
            if cached and policy != "Always":
                events.normal(
                    pod, "Pulled", f'Container image "{image}" already present on machine'
                )
                return image_id(image)
            if policy == "Never":
                reason = "ErrImageNeverPull"
                message = f'Container image "{image}" is not present with pull policy of Never'
            elif (error := await self._images.pull_error(image)) is None:
                events.normal(pod, "Pulling", f'Pulling image "{image}"')
                delay = 0.0 if cached else self._images.pull_seconds
                if await sleep(delay):
                    return None
                if await self._images.pull_error(image) is None:  # not removed meanwhile
                    self.pulled.add(normalize(image))
                    events.normal(
                        pod,
                        "Pulled",
                        f'Successfully pulled image "{image}" in '
                        f"{delay:.3f}s ({delay:.3f}s including waiting)",
                    )
                    return image_id(image)
                continue
            else:
                reason = "ErrImagePull"
                message = error
                events.warning(pod, "Failed", f'Failed to pull image "{image}": {message}')
            backoff = self._timing.backoff(
                self._timing.image_pull_backoff_seconds,
                self._timing.image_pull_backoff_max_seconds,
                attempt,
            )
            attempt += 1
            waiting(reason, message)
            events.warning(pod, "Failed", f"Error: {reason}")
            # The next pod sync finds the pull backing off: that is when the status says so.
            first = min(1.0, backoff / 2)
            if await sleep(first):
                return None
            if reason == "ErrImagePull":
                waiting("ImagePullBackOff", f'Back-off pulling image "{image}"')
                events.normal(pod, "BackOff", f'Back-off pulling image "{image}"')
                events.warning(pod, "Failed", "Error: ImagePullBackOff")
            if await sleep(backoff - first):
                return None
