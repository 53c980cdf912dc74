"""The node's image cache against a real registry (Debian's docker-registry), real skopeo and
real umoci: a tag resolves to the registry's digest and unpacks to a root filesystem with the
image's config; a second pull of the digest copies nothing; concurrent pulls of one image are
one copy, and two caches on one folder (two agents) keep both images in the layout; a missing
image fails at once naming it and the registry's words; past the cap the least recently used
image goes, never one in use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.agent.images import ImageCache, ImagePullError
from levers9.core.image_reference import ImageReference, ImageReferenceError
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def images(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two busybox images that differ by one file: name -> the digest the registry serves."""
    layout = tmp_path_factory.mktemp("build") / "layout"
    pushed = {}
    for name in ("one", "two"):
        build_busybox(layout, name, marker=name)
        pushed[name] = push_layout(layout, f"{registry.address}/tasks/busybox:{name}", name)
    return pushed


def _cache(root: Path, registry: LocalRegistry, max_bytes: int = 10**12) -> ImageCache:
    return ImageCache(root, insecure=[registry.address], max_bytes=max_bytes)


@pytest.mark.parametrize(
    ("text", "host", "path", "tag"),
    [
        ("busybox", "docker.io", "library/busybox", None),
        ("pytorch/pytorch:2.5", "docker.io", "pytorch/pytorch", "2.5"),
        (
            "127.0.0.1:5051/demo/levers9/worker:latest",
            "127.0.0.1:5051",
            "demo/levers9/worker",
            "latest",
        ),
        ("us-central1-docker.pkg.dev/p/r/vllm:v1", "us-central1-docker.pkg.dev", "p/r/vllm", "v1"),
    ],
)
def test_references_parse_as_docker_reads_them(
    text: str, host: str, path: str, tag: str | None
) -> None:
    parsed = ImageReference.parse(text)
    assert (parsed.host, parsed.path, parsed.tag) == (host, path, tag)


@pytest.mark.parametrize("text", ["", "UPPER/case", "a b", "repo:", "repo@sha256:12", "x" * 2000])
def test_a_bad_reference_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(ImageReferenceError, match=r"\[registry/\]repository\[:tag\]"):
        ImageReference.parse(text)


async def test_a_tag_pulls_its_digest_and_unpacks_it_once(
    registry: LocalRegistry, images: dict[str, str], tmp_path: Path
) -> None:
    cache = _cache(tmp_path, registry)
    reference = f"{registry.address}/tasks/busybox:one"
    first = await cache.pull(reference)
    assert first.digest == images["one"]
    assert not first.cached
    assert first.bytes_pulled > 500_000, "busybox's layer"
    assert (first.rootfs / "bin" / "busybox").stat().st_size > 500_000
    assert (first.rootfs / "etc" / "levers9-marker").read_text() == "one"
    assert first.config.cmd == ("/bin/sh", "-c", "echo hello from busybox")
    assert first.config.env == ("PATH=/bin", "IMAGE_GREETING=hello")
    assert (first.config.working_dir, first.config.user) == ("/work", "task")

    again = await cache.pull(reference)
    by_digest = await cache.pull(f"{registry.address}/tasks/busybox@{images['one']}")
    assert again.cached
    assert by_digest.cached
    assert (again.bytes_pulled, by_digest.bytes_pulled) == (0, 0)
    assert again.rootfs == first.rootfs
    assert cache.copies == 1


async def test_concurrent_pulls_of_one_image_are_one_copy(
    registry: LocalRegistry, images: dict[str, str], tmp_path: Path
) -> None:
    cache = _cache(tmp_path, registry)
    reference = f"{registry.address}/tasks/busybox:two"
    pulled = await asyncio.gather(*(cache.pull(reference) for _ in range(5)))
    assert {p.digest for p in pulled} == {images["two"]}
    assert cache.copies == 1
    assert sum(not p.cached for p in pulled) == 1


async def test_two_agents_on_one_cache_keep_both_images(
    registry: LocalRegistry, images: dict[str, str], tmp_path: Path
) -> None:
    """Two caches on one folder (two agents on a node) pulling two images at once: the lock
    keeps both in the layout's index, and each is then cached for the other."""
    one, two = _cache(tmp_path, registry), _cache(tmp_path, registry)
    await asyncio.gather(
        one.pull(f"{registry.address}/tasks/busybox:one"),
        two.pull(f"{registry.address}/tasks/busybox:two"),
    )
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    assert {m["digest"] for m in index["manifests"]} == set(images.values())
    crossed = await asyncio.gather(
        one.pull(f"{registry.address}/tasks/busybox:two"),
        two.pull(f"{registry.address}/tasks/busybox:one"),
    )
    assert all(p.cached for p in crossed)


async def test_a_missing_image_fails_at_once_naming_it(
    registry: LocalRegistry, images: dict[str, str], tmp_path: Path
) -> None:
    cache = _cache(tmp_path, registry)
    missing = f"{registry.address}/tasks/busybox:no-such-tag"
    with pytest.raises(ImagePullError) as failed:
        await asyncio.wait_for(cache.pull(missing), timeout=60)
    message = str(failed.value)
    assert message.startswith(f"cannot pull {missing}: ")
    assert "manifest unknown" in message
    assert cache.copies == 0
    assert cache.cached() == []


async def test_past_the_cap_the_least_recently_used_image_goes(
    registry: LocalRegistry, images: dict[str, str], tmp_path: Path
) -> None:
    sizing = _cache(tmp_path / "sizing", registry)
    await sizing.pull(f"{registry.address}/tasks/busybox:one")
    one_image = sizing.size()
    # Room for one image and a half: pulling the second evicts the first.
    cache = _cache(tmp_path / "cache", registry, max_bytes=one_image * 3 // 2)
    first = await cache.pull(f"{registry.address}/tasks/busybox:one")
    second = await cache.pull(f"{registry.address}/tasks/busybox:two")
    assert cache.cached() == [second.digest]
    assert not first.rootfs.exists()
    assert cache.size() <= cache.max_bytes
    index = json.loads((tmp_path / "cache" / "layout" / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [second.digest]

    # An image in use stays, whatever the cap says: both are kept, over the cap, until the
    # next pull finds the first one free again.
    with cache.in_use(second.digest):
        again = await cache.pull(f"{registry.address}/tasks/busybox:one")
        assert set(cache.cached()) == {first.digest, second.digest}
        assert second.rootfs.exists()
        assert again.rootfs.exists()
    assert cache.copies == 3
