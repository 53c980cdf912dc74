"""`--volume NAME:/path[:ro]` and `--disk NAME:/path`: what a task may mount, and the refusal
naming what is wrong for what it may not."""

from __future__ import annotations

import pytest

from levers9.core.storage import MAX_MOUNTS, TaskMount, mounts_problem, parse_mount


def test_a_volume_and_a_disk_parse_as_docker_run_v_reads() -> None:
    assert parse_mount("volume", "data:/data:ro") == TaskMount(
        kind="volume", name="data", path="/data", read_only=True
    )
    assert parse_mount("volume", "data:/mnt/in:rw").read_only is False
    assert parse_mount("disk", "scratch:/scratch") == TaskMount(
        kind="disk", name="scratch", path="/scratch"
    )


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("data", "give NAME:/path"),
        ("data:/data:rx", "ro or rw"),
        ("Data:/data", "not a volume name"),
        ("data:relative", "not an absolute path"),
        ("data:/", "the task's own root"),
        ("data:/proc/x", "the runtime's (/proc)"),
        ("data:/a/../etc", "has . or .."),
        ("data:/etc/resolv.conf", "the runtime's"),
    ],
)
def test_a_bad_mount_is_refused_naming_the_option_and_what_is_wrong(given: str, says: str) -> None:
    with pytest.raises(ValueError, match="--volume") as refused:
        parse_mount("volume", given)
    assert says in str(refused.value)


def test_mounts_together_overlap_or_repeat_a_disk() -> None:
    a = TaskMount(kind="volume", name="a", path="/data")
    inside = TaskMount(kind="volume", name="b", path="/data/sub")
    disk = TaskMount(kind="disk", name="d", path="/scratch")
    again = TaskMount(kind="disk", name="d", path="/other")
    assert mounts_problem([a, disk]) is None
    assert "one mount point inside another" in (mounts_problem([a, inside]) or "")
    assert "disk d twice" in (mounts_problem([disk, again]) or "")
    many = [TaskMount(kind="volume", name="v", path=f"/m{i}") for i in range(MAX_MOUNTS + 1)]
    assert f"at most {MAX_MOUNTS}" in (mounts_problem(many) or "")
