"""The README's layout section matches the tree: every top-level folder and every module and
package of `levers9/` is named there, and everything named there exists. README and docs link
nothing outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BUILT = frozenset({"build", "dist"})
"""Folders a build leaves, not part of the tree."""


def _layout() -> str:
    text = README.read_text()
    section = text[text.index("## Layout\n") :]
    return section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][\w.]*/?", text))


def test_every_top_level_folder_is_named_and_exists() -> None:
    layout = _layout()
    top = {line.split()[0] for line in layout.splitlines() if line and not line.startswith(" ")}
    folders = {
        f"{p.name}/"
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__")) and p.name not in BUILT
        if not p.name.endswith(".egg-info")
    }
    assert folders <= top, f"not in the README's layout: {sorted(folders - top)}"
    for name in top:
        assert (ROOT / name.rstrip("/")).exists(), f"the layout names {name}, which is not there"


def test_every_levers9_module_and_package_is_named() -> None:
    layout = _layout()
    block = layout[layout.index("levers9/") : layout.index("\nworkflows/")]
    words = _words(block)
    package = ROOT / "levers9"
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    packages = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
    missing = sorted((modules - words) | (packages - words))
    assert missing == [], f"levers9/ modules the README's layout does not name: {missing}"
    named = {w for w in words if w.endswith("/")} - {"levers9/"}
    assert named <= packages, f"the layout names packages levers9 lacks: {sorted(named - packages)}"


def test_no_link_leaves_the_repository() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    outside = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in pages
        for link in re.findall(r"\]\(([^)]*)\)", page.read_text())
        if link.startswith("../") or "shared/" in link
    ]
    assert outside == []
