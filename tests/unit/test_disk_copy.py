"""The copy `levers9 disk snapshot` and `disk create --from` run as a task (`copy_script`), run
here by the real sh, GNU tar and find between two directories standing in for the disk and the
volume; and the commands' refusal of a VOLUME/PATH they cannot take, before anything is asked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from levers9 import logs
from levers9.cli.disk import copy_script
from levers9.cli.main import app


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def _disk(root: Path) -> Path:
    disk = root / "disk"
    (disk / "lost+found").mkdir(parents=True)
    (disk / "lost+found" / "orphan").write_text("fsck's, not the task's")
    (disk / "sub").mkdir()
    (disk / "kept.txt").write_text("kept\n")
    (disk / "sub" / "zeros").write_bytes(bytes(100_000))
    return disk


def test_a_copy_says_its_files_and_bytes_and_leaves_lost_and_found(tmp_path: Path) -> None:
    disk, target = _disk(tmp_path), tmp_path / "volume" / "snaps" / "one"
    done = _run(copy_script(str(disk), str(target), "volume v/snaps/one", fresh_target=True))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "levers9-copy: copying 2 files, 100005 bytes: volume v/snaps/one" in done.stdout
    assert done.stdout.rstrip().endswith("levers9-copy: done files=2 bytes=100005")
    assert (target / "kept.txt").read_text() == "kept\n"
    assert (target / "sub" / "zeros").stat().st_size == 100_000
    assert not (target / "lost+found").exists()

    # Back into a fresh disk (which has its own lost+found): the same files.
    fresh = tmp_path / "fresh"
    (fresh / "lost+found").mkdir(parents=True)
    back = _run(copy_script(str(target), str(fresh), "volume v/snaps/one", fresh_target=False))
    assert back.returncode == 0, back.stdout + back.stderr
    assert "levers9-copy: done files=2 bytes=100005" in back.stdout
    assert (fresh / "kept.txt").read_text() == "kept\n"


def test_a_snapshot_to_a_path_that_holds_files_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    disk, target = _disk(tmp_path), tmp_path / "volume"
    target.mkdir()
    (target / "earlier.txt").write_text("an earlier snapshot's")
    done = _run(copy_script(str(disk), str(target), "volume v", fresh_target=True))
    assert done.returncode == 3
    assert "levers9-copy: refused: volume v already holds files: choose another path" in (
        done.stdout
    )
    assert sorted(p.name for p in target.iterdir()) == ["earlier.txt"]


def test_nothing_at_the_source_is_said(tmp_path: Path) -> None:
    done = _run(
        copy_script(
            str(tmp_path / "none"), str(tmp_path / "disk"), "volume v/x", fresh_target=False
        )
    )
    assert done.returncode == 3
    assert done.stdout.strip() == "levers9-copy: failed: nothing to copy at volume v/x"


def test_a_path_with_odd_characters_stays_one_argument(tmp_path: Path) -> None:
    """The paths are quoted into the script: a space or a quote is a name, never shell."""
    disk = _disk(tmp_path)
    target = tmp_path / "it's a $(touch pwned) dir"
    done = _run(copy_script(str(disk), str(target), "volume v", fresh_target=True))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "kept.txt").exists()
    assert not (Path.cwd() / "pwned").exists()


def test_a_target_that_cannot_be_made_is_said(tmp_path: Path) -> None:
    disk, target = _disk(tmp_path), tmp_path / "volume"
    target.write_text("a file where the copy needs a directory")
    done = _run(copy_script(str(disk), str(target / "x"), "volume v/x", fresh_target=True))
    assert done.returncode == 4
    assert "levers9-copy: failed: cannot make the target of volume v/x" in done.stdout


@pytest.mark.parametrize(
    ("args", "option", "said"),
    [
        (["snapshot", "scratch", "--to", "Data/x"], "--to", "the volume's name"),
        (["snapshot", "scratch", "--to", "data/../x"], "--to", "never . or .."),
        (["snapshot", "scratch", "--to", "data/a b"], "--to", "letters, digits"),
        (["create", "new", "--size", "1Gi", "--from", "data"], "--from", "give VOLUME/PATH"),
        (["create", "new", "--size", "1Gi", "--from", "data/"], "--from", "give VOLUME/PATH"),
    ],
)
def test_a_volume_path_it_cannot_take_is_refused_naming_the_option(
    args: list[str], option: str, said: str, tmp_path: Path
) -> None:
    env = {"LEVERS9_HOME": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "200"}
    try:
        result = CliRunner().invoke(app, ["disk", *args], env=env)
    finally:
        logs.setup("INFO", sys.stderr)  # the runner closes the stderr the CLI logged to
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert said in result.output
