"""The node's image cache: tasks' images pulled once per digest, unpacked once per digest.

Layout under the pool's `imagesPath` (a hostPath the worker Job mounts, so the cache outlives
the worker):

    layout/            one OCI image layout (blobs shared between images), one tag per digest
                       (`sha256-<hex>`), written only by `skopeo copy` under the lock
    rootfs/<hex>/      the image's root filesystem (`umoci raw unpack`), read-only to tasks:
                       each container gets its own writable layer above it (overlayfs)
    rootfs/<hex>.used  touched at each use: least recently used images go first past the cap
    rootfs/<hex>.refs  the references (as Docker reads them) pulled as that digest, one a line:
                       what heartbeats report with the pool's `cache.enabled` (`references`)
    shifted/<hex>-<id>/
                       the same root owned by a task's user-namespace range (its 0 is the
                       node's <id>: levers9.agent.id_ranges), unpacked once per digest and
                       range (`shifted`), evicted with its image
    lock               flock(2): one writer at a time across processes (two `skopeo copy` into
                       one layout at once lose index entries)

A reference is resolved to its manifest digest first (`skopeo inspect --raw`, the sha256 of
the manifest's bytes), so a tag that moved pulls the new image and a digest already cached
pulls nothing; concurrent pulls of one digest in this process share one pull. A failed pull
raises `ImagePullError` naming the image and quoting the registry's own words, once: no retry
loop here (the task ends with the reason).

Registry credentials are the node's (`authFile`, as the kubelet's; GKE's node service account
reaches Artifact Registry through it), with `mirrors` mapping a registry host to where it is
served (the dev stack's Artifact Registry on loopback) and `insecure` hosts spoken to over
plain HTTP (loopback registries only).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.core.image_reference import ImageReference
from levers9.logs import get_logger

log = get_logger("levers9.agent")

DEFAULT_MAX_BYTES = 100 * 1024**3
"""The cache's cap when the pool sets none: 100 GiB of blobs and root filesystems."""
MAX_REFS = 8
"""The most references one digest keeps (tags that moved onto it): the newest."""
PULL_TIMEOUT_S = 30 * 60.0
"""A 20 GB CUDA image over a slow link; a registry that never answers fails sooner (skopeo's
own timeouts)."""


class ImagePullError(RuntimeError):
    """The image could not be pulled; the message names the image and the registry's error."""


@dataclass(frozen=True)
class ImageConfig:
    """What Docker honours of the image's config when it runs it."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""

    @classmethod
    def from_oci(cls, document: Mapping[str, Any]) -> ImageConfig:
        config = document.get("config") or {}
        return cls(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            working_dir=str(config.get("WorkingDir") or ""),
            user=str(config.get("User") or ""),
        )


@dataclass(frozen=True)
class PulledImage:
    reference: str
    digest: str
    rootfs: Path
    config: ImageConfig
    cached: bool
    """Nothing was copied: the digest was in the cache already."""
    bytes_pulled: int
    """Bytes of blobs this pull added to the layout (0 when cached)."""


class ImageCache:
    """One node's cache (see the module's docstring); safe to share between tasks and between
    agents on the node (the lock)."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        mirrors: Mapping[str, str] | None = None,
        insecure: Sequence[str] = (),
        auth_file: Path | None = None,
        skopeo: str = "skopeo",
        umoci: str = "umoci",
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._mirrors = dict(mirrors or {})
        self._insecure = frozenset(insecure)
        self._auth_file = auth_file
        self._skopeo, self._umoci = skopeo, umoci
        self._inflight: dict[str, asyncio.Future[PulledImage]] = {}
        self._pinned: dict[str, int] = {}
        self.copies = 0
        """How many `skopeo copy` this cache ran (what a benchmark and the tests count)."""
        for folder in (self.layout, self.root / "rootfs"):
            folder.mkdir(parents=True, exist_ok=True)

    @property
    def layout(self) -> Path:
        return self.root / "layout"

    # -- pulling ------------------------------------------------------------------------------

    async def pull(self, reference: str) -> PulledImage:
        """The image, pulled into the cache unless its digest is there already."""
        parsed = ImageReference.parse(reference)
        digest = parsed.digest or await self._resolve(parsed, reference)
        running = self._inflight.get(digest)
        if running is not None:
            shared = await asyncio.shield(running)
            return PulledImage(reference, digest, shared.rootfs, shared.config, True, 0)
        future: asyncio.Future[PulledImage] = asyncio.get_running_loop().create_future()
        self._inflight[digest] = future
        try:
            pulled = await self._pull(parsed, reference, digest)
            future.set_result(pulled)
            return pulled
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a pull nobody shared must not warn
            raise
        finally:
            del self._inflight[digest]

    async def _pull(self, parsed: ImageReference, reference: str, digest: str) -> PulledImage:
        hex_ = digest.removeprefix("sha256:")
        rootfs = self.root / "rootfs" / hex_
        with await asyncio.to_thread(self._locked):
            if (rootfs / ".complete").exists():
                self._touch(hex_, parsed)
                return PulledImage(reference, digest, rootfs, self._config(hex_), True, 0)
            before = self._blob_bytes()
            await self._copy(parsed, reference, digest, f"sha256-{hex_}")
            pulled = self._blob_bytes() - before
            await self._unpack(f"sha256-{hex_}", rootfs)
            self._touch(hex_, parsed)
            log.info("image pulled", image=reference, digest=digest, bytes=pulled)
            image = PulledImage(reference, digest, rootfs, self._config(hex_), False, pulled)
            self._evict(keep=hex_)
        return image

    async def _resolve(self, parsed: ImageReference, reference: str) -> str:
        """The manifest digest the registry serves for the tag: the sha256 of its bytes."""
        manifest = await self._run_skopeo(
            reference,
            "inspect",
            *self._flags(parsed.host, "tls-verify"),
            "--raw",
            self._source(parsed, str(parsed)),
        )
        return "sha256:" + hashlib.sha256(manifest).hexdigest()

    async def _copy(self, parsed: ImageReference, reference: str, digest: str, tag: str) -> None:
        self.copies += 1
        await self._run_skopeo(
            reference,
            "copy",
            "--quiet",
            *self._flags(parsed.host, "src-tls-verify"),
            self._source(parsed, parsed.at(digest)),
            f"oci:{self.layout}:{tag}",
        )

    def _source(self, parsed: ImageReference, text: str) -> str:
        mirror = self._mirrors.get(parsed.host)
        if mirror:
            text = mirror + text[len(parsed.host) :]
        return f"docker://{text}"

    def _flags(self, host: str, tls_flag: str) -> list[str]:
        served = self._mirrors.get(host, host)
        flags = []
        if served in self._insecure:
            flags.append(f"--{tls_flag}=false")
        if self._auth_file is not None:
            flags.append(f"--authfile={self._auth_file}")
        return flags

    async def _run_skopeo(self, reference: str, *args: str) -> bytes:
        try:
            process = await asyncio.create_subprocess_exec(
                self._skopeo,
                "--insecure-policy",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise ImagePullError(
                f"cannot pull {reference}: skopeo is not installed on this worker"
            ) from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), PULL_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise ImagePullError(
                f"cannot pull {reference}: no answer within {PULL_TIMEOUT_S:.0f} s"
            ) from None
        if process.returncode != 0:
            raise ImagePullError(f"cannot pull {reference}: {_registry_words(err)}")
        return out

    async def _unpack(self, tag: str, rootfs: Path, *maps: str) -> None:
        partial = rootfs.with_name(rootfs.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        rootless = ["--rootless"] if os.geteuid() != 0 else []
        process = await asyncio.create_subprocess_exec(
            self._umoci,
            "raw",
            "unpack",
            *rootless,
            *maps,
            "--image",
            f"{self.layout}:{tag}",
            str(partial),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await process.communicate()
        if process.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise ImagePullError(f"cannot unpack {tag}: {err.decode(errors='replace').strip()}")
        shutil.rmtree(rootfs, ignore_errors=True)
        partial.rename(rootfs)
        (rootfs / ".complete").touch()

    async def shifted(self, digest: str, host_id: int, size: int) -> Path:
        """The pulled image's root owned by the user-namespace range whose 0 is the node's
        `host_id` (a file of uid N in the image is `host_id + N` here), unpacked on first use
        and kept (`shifted/<hex>-<host_id>`).

        runc 1.1 has no idmapped mounts, so the ownership is shifted on disk. `umoci raw unpack
        --uid-map/--gid-map` from the layout's blobs rather than a copy and chown of the
        unshifted root: the image's own layers give every owner, hard link, setuid bit and
        xattr exactly (a chown clears setuid bits and file capabilities, a copy splits hard
        links), for a cost of the same order (docs/architecture.md: 1.6 s against 1.1 s for
        `cp -a` and a chown walk, the tests' Python image)."""
        hex_ = digest.removeprefix("sha256:")
        root = self.root / "shifted" / f"{hex_}-{host_id}"
        with await asyncio.to_thread(self._locked):
            if not (root / ".complete").exists():
                root.parent.mkdir(exist_ok=True)
                mapping = f"0:{host_id}:{size}"
                await self._unpack(
                    f"sha256-{hex_}", root, "--uid-map", mapping, "--gid-map", mapping
                )
                log.info("image root shifted", digest=digest, host_id=host_id)
            self._touch(hex_)
        return root

    # -- what is cached -----------------------------------------------------------------------

    def _index(self) -> list[dict[str, Any]]:
        index = self.layout / "index.json"
        if not index.exists():
            return []
        manifests: list[dict[str, Any]] = json.loads(index.read_text()).get("manifests") or []
        return manifests

    def _blob(self, digest: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(
            (self.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_text()
        )
        return document

    def _config(self, hex_: str) -> ImageConfig:
        manifest = self._blob(f"sha256:{hex_}")
        return ImageConfig.from_oci(self._blob(manifest["config"]["digest"]))

    def cached(self) -> list[str]:
        """The digests whose root filesystem is ready, least recently used first."""
        ready = [p for p in (self.root / "rootfs").iterdir() if (p / ".complete").exists()]
        ready.sort(key=lambda p: self._used(p.name))
        return [f"sha256:{p.name}" for p in ready]

    def size(self) -> int:
        """Bytes the cache holds: the layout's blobs and every root filesystem."""
        return self._blob_bytes() + sum(
            _tree_bytes(p) for p in self._roots("rootfs") + self._roots("shifted") if p.is_dir()
        )

    def _roots(self, folder: str) -> list[Path]:
        with contextlib.suppress(FileNotFoundError):
            return list((self.root / folder).iterdir())
        return []

    def _blob_bytes(self) -> int:
        return _tree_bytes(self.layout / "blobs")

    def _used(self, hex_: str) -> float:
        with contextlib.suppress(FileNotFoundError):
            return (self.root / "rootfs" / f"{hex_}.used").stat().st_mtime
        return 0.0

    def _touch(self, hex_: str, parsed: ImageReference | None = None) -> None:
        (self.root / "rootfs" / f"{hex_}.used").touch()  # its mtime is the last use
        if parsed is None:
            return
        refs = self.root / "rootfs" / f"{hex_}.refs"
        known = self._refs(hex_)
        if str(parsed) not in known:  # under the lock: one writer
            tmp = refs.with_suffix(".refs-tmp")
            tmp.write_text("".join(f"{r}\n" for r in [str(parsed), *known][:MAX_REFS]))
            tmp.replace(refs)

    def _refs(self, hex_: str) -> list[str]:
        with contextlib.suppress(FileNotFoundError):
            return (self.root / "rootfs" / f"{hex_}.refs").read_text().split()
        return []

    def references(self, limit: int = 64) -> list[str]:
        """The references (normalized) pulled as the images the cache holds, most recently
        used first, at most `limit`: what a heartbeat reports with the pool's `cache.enabled`
        (a digest pinned reference names itself; a digest pulled under no reference, none)."""
        held: list[str] = []
        for digest in reversed(self.cached()):
            for reference in self._refs(digest.removeprefix("sha256:")):
                if len(held) >= limit:
                    return held
                if reference not in held:
                    held.append(reference)
        return held

    # -- in use, and eviction -----------------------------------------------------------------

    @contextlib.contextmanager
    def in_use(self, digest: str) -> Iterator[None]:
        """Holds the image against eviction while a container runs on it."""
        self._pinned[digest] = self._pinned.get(digest, 0) + 1
        try:
            yield
        finally:
            self._pinned[digest] -= 1
            if not self._pinned[digest]:
                del self._pinned[digest]

    def _evict(self, keep: str) -> None:
        """Least recently used images out until the cache fits its cap (never `keep`, never one
        in use); then the layout's blobs no image names any more."""
        total = self.size()  # walked once; each eviction subtracts what it freed
        evicted = []
        for digest in self.cached():
            if total <= self.max_bytes:
                break
            hex_ = digest.removeprefix("sha256:")
            if hex_ == keep or digest in self._pinned:
                continue
            rootfs = self.root / "rootfs" / hex_
            freed = _tree_bytes(rootfs)
            shutil.rmtree(rootfs, ignore_errors=True)
            for shifted in self._roots("shifted"):
                if shifted.name.startswith(f"{hex_}-"):
                    freed += _tree_bytes(shifted)
                    shutil.rmtree(shifted, ignore_errors=True)
            (self.root / "rootfs" / f"{hex_}.used").unlink(missing_ok=True)
            (self.root / "rootfs" / f"{hex_}.refs").unlink(missing_ok=True)
            self._untag(f"sha256-{hex_}")
            # Its blobs go now, not after the loop: until then they still count.
            total -= freed + self._gc()
            evicted.append(digest)
        if evicted:
            log.info("images evicted", digests=evicted, bytes=total, cap=self.max_bytes)

    def _untag(self, tag: str) -> None:
        index = self.layout / "index.json"
        document = json.loads(index.read_text())
        document["manifests"] = [
            m
            for m in document.get("manifests") or []
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") != tag
        ]
        tmp = index.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        tmp.replace(index)

    def _gc(self) -> int:
        """Removes the blobs no manifest of the index reaches; returns their bytes."""
        reachable = set()
        for entry in self._index():
            manifest_digest = entry["digest"]
            reachable.add(manifest_digest)
            manifest = self._blob(manifest_digest)
            reachable.add(manifest["config"]["digest"])
            reachable.update(layer["digest"] for layer in manifest.get("layers") or [])
        freed = 0
        for blob in (self.layout / "blobs" / "sha256").iterdir():
            if f"sha256:{blob.name}" not in reachable:
                freed += blob.lstat().st_size
                blob.unlink()
        return freed

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The cache's lock, taken (blocking, in a thread: another agent may hold it)."""
        handle = (self.root / "lock").open("a")
        fcntl.flock(handle, fcntl.LOCK_EX)

        @contextlib.contextmanager
        def held() -> Iterator[None]:
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()

        return held()


def _tree_bytes(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _registry_words(stderr: bytes) -> str:
    """skopeo's last line, which carries the registry's own error (`manifest unknown`, `401
    Unauthorized`, `no such host`), without the `time=... level=fatal msg=` wrapping."""
    lines = [line for line in stderr.decode(errors="replace").strip().splitlines() if line]
    text = lines[-1] if lines else "skopeo failed without a word"
    match = re.search(r'msg="(.*)"\s*$', text)
    return (match.group(1) if match else text).replace('\\"', '"')[:2000]
