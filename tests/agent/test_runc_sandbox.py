"""A runc task's sandbox, seen from inside a real task (real runc, umoci, skopeo, a registry):
moby's seccomp profile (`Seccomp: 2`, `unshare` and `mount` refused), a user namespace of its
own range (not the identity map; the image's owners kept; no two running tasks share a range,
an adopted container keeps its own), a memory and a pids limit, runc's masked and read-only
paths, and a writable layer of a fixed size; going over a limit fails the task naming it
(`OOMKilled`, `pids limit`, `disk full`). Root only, as runc is.

Found here: the machine is cgroup v1 (hybrid: memory and pids are v1 hierarchies, the unified
one has no controller), so the task reads `memory/memory.limit_in_bytes` and `pids/pids.max`;
on v2 it reads `memory.max` and `pids.max`. This kernel has no `/proc/kcore` at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.agent.id_ranges import FIRST_ID, RANGE_SIZE, IdRanges
from levers9.agent.images import ImageCache, ImageConfig, PulledImage
from levers9.agent.runc_config import MASKED_PATHS, Limits
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import LAYER_FILE, RuncRuntime, root_mount
from levers9.agent.runtime import ContainerSpec
from levers9.agent.seccomp import SeccompProfileError, load_profile, oci_seccomp
from levers9.agent.supervisor import TaskManager
from levers9.proto import worker_pb2
from sandbox.registries import LocalRegistry
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]
MEMORY = 64 * 1024**2
PIDS = 64
DISK = 16 * 1024**2


@pytest.fixture
def ranges(tmp_path: Path) -> IdRanges:
    return IdRanges(tmp_path / "userns")


@pytest.fixture
def runtime(image: tuple[LocalRegistry, str], tmp_path: Path, ranges: IdRanges) -> RuncRuntime:
    cache = ImageCache(tmp_path / "images", insecure=[image[0].address])
    return _runtime(cache, tmp_path, ranges)


def _runtime(images: ImageCache, tmp_path: Path, ranges: IdRanges, **given: object) -> RuncRuntime:
    return RuncRuntime(
        images,
        tmp_path / "runc",
        dev_root=tmp_path / "no-cards",
        cards=(),
        limits=Limits(memory_bytes=MEMORY, pids=PIDS, disk_bytes=DISK),
        id_ranges=ranges,
        **given,  # type: ignore[arg-type]
    )


def _spec(tmp_path: Path, image: str, name: str, script: str) -> ContainerSpec:
    task = tmp_path / name
    return ContainerSpec(
        task_id=name,
        image=image,
        command=("sh", "-c", script),
        env={},
        gpu_indices=(),
        result_path=task / "result" / "result.json",
        work_dir=task / "work",
    )


async def _run(runtime: RuncRuntime, spec: ContainerSpec) -> tuple[int, str]:
    out = bytearray()
    container = await runtime.start(spec, out.extend)
    code = await asyncio.wait_for(container.wait(), 60)
    return code, out.decode()


INSIDE = """
echo "seccomp $(busybox grep '^Seccomp:' /proc/self/status)"
echo "uid_map $(cat /proc/self/uid_map)"
echo "memory $(cat /sys/fs/cgroup/memory.max 2>/dev/null || \
  cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "pids $(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)"
echo "kcore $(cat /proc/kcore 2>/dev/null | wc -c)"
for p in {masked}; do [ -e $p ] && echo "masked $p $(cat $p 2>/dev/null | wc -c)"; done
busybox awk '{{print "mount", $5, $6}}' /proc/self/mountinfo
echo "sys $(busybox touch /sys/kernel/mine 2>&1)"
echo "procsys $( (echo 1 > /proc/sys/vm/drop_caches) 2>&1)"
echo "unshare $(busybox unshare -U true 2>&1)"
echo "mountcall $(busybox mount -t tmpfs none /work 2>&1)"
owner() {{ ls -lnd "$1" | busybox awk '{{print $3 ":" $4}}'; }}
echo "owners $(owner /work) $(owner /bin/busybox)"
echo "id $(id -u)"
echo mine > /work/mine && echo "wrote /work/mine"
"""


async def test_the_task_is_sandboxed(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = _spec(tmp_path, image[1], "inside", INSIDE.format(masked=" ".join(MASKED_PATHS)))
    code, out = await _run(runtime, spec)
    assert code == 0, out
    seen: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        seen.setdefault(key, []).append(" ".join(value.split()))
    assert seen["seccomp"] == ["Seccomp: 2"]
    inside, node, size = seen["uid_map"][0].split()
    assert (inside, node, size) == ("0", str(FIRST_ID), str(RANGE_SIZE)), "not the identity map"
    assert seen["memory"] == [str(MEMORY)]
    assert seen["pids"] == [str(PIDS)]
    assert seen["kcore"] == ["0"], "masked, or (this kernel) absent"
    mounts = dict(m.split(" ", 1) for m in seen["mount"])
    for masked in seen.get("masked", []):
        path, read = masked.split()
        assert path in mounts, f"{path} is masked: {masked}"
        assert read == "0", f"{path} reads as nothing: {masked}"
    assert {p for p in MASKED_PATHS if p in mounts} >= {"/proc/keys", "/proc/timer_list"}
    assert "ro" in mounts["/sys"].split(","), mounts["/sys"]
    assert "Read-only file system" in seen["sys"][0]
    assert "Read-only file system" in seen["procsys"][0]
    assert "Operation not permitted" in seen["unshare"][0], "seccomp: no namespace of its own"
    assert seen["mountcall"][0], "mount is refused"
    assert seen["owners"] == ["1000:1000 0:0"], "the image's owners, inside"
    assert seen["id"] == ["1000"]
    assert seen["wrote"] == ["/work/mine"], "its user writes what it owns"
    # On the node: the image's files and the task's own belong to the task's range.
    shifted = next((tmp_path / "images" / "shifted").iterdir())
    assert shifted.name.endswith(f"-{FIRST_ID}")
    assert (shifted / "work").stat().st_uid == FIRST_ID + 1000
    assert (shifted / "bin" / "busybox").stat().st_uid == FIRST_ID
    assert spec.result_path.parent.stat().st_uid == FIRST_ID + 1000


async def test_no_two_running_tasks_share_a_range_and_an_adopted_one_keeps_its_own(
    runtime: RuncRuntime,
    image: tuple[LocalRegistry, str],
    tmp_path: Path,
    ranges: IdRanges,
) -> None:
    first = await runtime.start(_spec(tmp_path, image[1], "first", "sleep 60"), lambda _: None)
    second = await runtime.start(_spec(tmp_path, image[1], "second", "sleep 60"), lambda _: None)
    assert isinstance(first, RuncContainer)
    assert isinstance(second, RuncContainer)
    try:
        assert [await _uid_map(runtime, c) for c in (first, second)] == [
            f"0 {FIRST_ID} {RANGE_SIZE}",
            f"0 {FIRST_ID + RANGE_SIZE} {RANGE_SIZE}",
        ]
        assert await asyncio.wait_for(first.stop(grace_s=0), 30) == 128 + 9
        assert not ranges.held(0), "its range is free once it has ended"
        # An agent started after this one (its predecessor gone, the containers running) on
        # the same work dir and the node's ranges.
        cache = ImageCache(tmp_path / "images", insecure=[image[0].address])
        again = _runtime(cache, tmp_path, IdRanges(ranges.folder))
        adopted = await again.adopt("second", lambda _: None, 0)
        assert isinstance(adopted, RuncContainer)
        assert await _uid_map(again, adopted) == f"0 {FIRST_ID + RANGE_SIZE} {RANGE_SIZE}"
        assert ranges.held(1), "held by the adopted container's shim"
        third = await again.start(_spec(tmp_path, image[1], "third", "sleep 60"), lambda _: None)
        assert isinstance(third, RuncContainer)
        assert await _uid_map(again, third) == f"0 {FIRST_ID} {RANGE_SIZE}", "not the adopted's"
        await asyncio.wait_for(third.stop(grace_s=0), 30)
        await asyncio.wait_for(adopted.stop(grace_s=0), 30)
        assert not ranges.held(1)
        for ended in (first, adopted, third):
            assert not root_mount(ended.bundle).is_mount(), "its root is unmounted"
            assert not (ended.bundle / "layer").is_mount(), "and its writable layer"
            assert not (ended.bundle / LAYER_FILE).exists()
    finally:
        for container in (first, second):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(container.stop(grace_s=0), 30)


async def _uid_map(runtime: RuncRuntime, container: RuncContainer) -> str:
    process = await runtime.exec(container, ["cat", "/proc/self/uid_map"])
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    return " ".join(out.decode().split())


GROW = 'x=a; while true; do x="$x$x"; done'
FORK = "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done"
"""busybox sh ends with an error when a fork fails: at the pids limit (64), before 200."""
FILL = "busybox dd if=/dev/zero of=/work/fill bs=1M count=64"


async def test_over_a_limit_the_task_fails_naming_it(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    reports: list[worker_pb2.TaskStatus] = []
    tasks = TaskManager(runtime, (), tmp_path / "work", reports.append)
    for name, script in (("grow", GROW), ("fork", FORK), ("fill", FILL), ("fine", "true")):
        await tasks.run(
            worker_pb2.TaskSpec(task_id=name, image=image[1], command=["sh", "-c", script])
        )

    def ended() -> dict[str, tuple[int, str]]:
        return {
            r.task_id: (r.state, r.reason)
            for r in reports
            if r.state != worker_pb2.TASK_STATE_RUNNING
        }

    await eventually(lambda: _true(len(ended()) == 4), within=60)
    failed = worker_pb2.TASK_STATE_FAILED
    assert ended()["grow"] == (failed, "OOMKilled")
    state, reason = ended()["fork"]
    assert (state, reason.split(":")[0]) == (failed, "pids limit"), reason
    assert f"limit of {PIDS} processes" in reason
    state, reason = ended()["fill"]
    assert (state, reason.split(":")[0]) == (failed, "disk full"), reason
    assert reason.endswith("its writable layer (16 MiB) (exited with code 1)"), reason
    assert ended()["fine"] == (worker_pb2.TASK_STATE_SUCCEEDED, "")


async def _true(value: bool) -> bool:
    return value


class _OwnRoot:
    """An images source that gives no shifted root (as the GPU check's does: the machine's
    own root, owned by its root): only pull, in_use and layout."""

    def __init__(self, cache: ImageCache) -> None:
        self._cache = cache
        self.layout = cache.layout

    async def pull(self, reference: str) -> PulledImage:
        pulled = await self._cache.pull(reference)
        return PulledImage(reference, pulled.digest, pulled.rootfs, ImageConfig(), True, 0)

    @contextlib.contextmanager
    def in_use(self, digest: str) -> Iterator[None]:
        yield


async def test_a_root_the_images_cannot_shift_is_read_only_to_the_task(
    image: tuple[LocalRegistry, str], tmp_path: Path, ranges: IdRanges
) -> None:
    own = _OwnRoot(ImageCache(tmp_path / "images", insecure=[image[0].address]))
    runtime = _runtime(own, tmp_path, ranges)  # type: ignore[arg-type]
    script = (
        'echo "$(busybox grep ^Seccomp: /proc/self/status)"; cat /proc/self/uid_map;'
        " (echo x > /etc/mine) 2>&1; echo x > /tmp/mine && echo tmp ok;"
        ' echo ok > "$LEVERS9_RESULT_PATH"'
    )
    spec = _spec(tmp_path, image[1], "own", script)
    code, out = await _run(runtime, spec)
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert code == 0, out
    assert lines[:2] == ["Seccomp: 2", f"0 {FIRST_ID} {RANGE_SIZE}"]
    assert "Read-only file system" in lines[2]
    assert lines[3:] == ["tmp ok"]
    assert spec.result_path.read_text() == "ok\n"


async def test_a_pools_profile_is_applied_and_a_bad_one_refused(
    image: tuple[LocalRegistry, str], tmp_path: Path, ranges: IdRanges
) -> None:
    profile = load_profile(Path(__file__).parents[2] / "levers9/agent/seccomp/default.json")
    for rule in profile["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n not in ("mkdir", "mkdirat")]
    mine = tmp_path / "no-mkdir.json"
    mine.write_text(json.dumps(profile))
    cache = ImageCache(tmp_path / "images", insecure=[image[0].address])
    runtime = _runtime(cache, tmp_path, ranges, seccomp_profile=mine)
    code, out = await _run(
        runtime, _spec(tmp_path, image[1], "nomkdir", "busybox mkdir /work/d 2>&1; true")
    )
    assert (code, "Operation not permitted" in out) == (0, True), out

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": []}]}))
    with pytest.raises(SeccompProfileError, match=r"broken.json: syscalls\[0\].names: missing"):
        _runtime(cache, tmp_path, ranges, seccomp_profile=broken)


def test_the_profile_follows_the_capabilities_and_the_architecture() -> None:
    profile = load_profile(Path(__file__).parents[2] / "levers9/agent/seccomp/default.json")

    def allowed(capabilities: list[str], machine: str = "x86_64") -> set[str]:
        converted = oci_seccomp(profile, capabilities, machine=machine, kernel="6.1.0")
        return {
            n
            for rule in converted["syscalls"]
            if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
            for n in rule["names"]
        }

    runc = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    assert {"mount", "unshare", "setns", "bpf", "keyctl"}.isdisjoint(allowed(runc))
    assert {"mount", "unshare", "setns"} <= allowed([*runc, "CAP_SYS_ADMIN"])
    assert "arch_prctl" in allowed(runc)
    assert "arch_prctl" not in allowed(runc, "aarch64")
    converted = oci_seccomp(profile, runc, machine="x86_64")
    assert converted["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    assert converted["defaultAction"] == "SCMP_ACT_ERRNO"
