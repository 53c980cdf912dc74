"""The real helm binary (deploy/dev/install-helm.sh puts it in .venv/bin) and the chart."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "levers9-controlplane"


def tool(name: str, install: str) -> str:
    """A tool the tests run for real: beside this Python (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} is not installed: {install}")
    return found


def helm_binary() -> str:
    return tool("helm", "run deploy/dev/install-helm.sh .venv/bin")


def helm(*args: str, ok: bool = True, env: dict[str, str] | None = None) -> str:
    """Runs helm; stdout when it succeeds, stderr when it fails (as `ok` expects)."""
    done = subprocess.run(
        [helm_binary(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    if ok and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stderr}")
    if not ok and done.returncode == 0:
        raise AssertionError(f"helm {' '.join(args)} succeeded:\n{done.stdout}")
    return done.stdout if ok else done.stderr


def render(
    values: Sequence[Path] = (), *extra: str, release: str = "levers9"
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its manifests, in order."""
    args = ["template", release, str(CHART), "--namespace", "levers9-system"]
    for path in values:
        args += ["-f", str(path)]
    out = helm(*args, *extra)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(values: Path, setting: str) -> str:
    """`helm template` of the chart with `values` and `--set setting`, which must fail: what
    helm said."""
    return helm("template", "t", str(CHART), "-f", str(values), "--set", setting, ok=False)


def find(docs: Sequence[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(matches) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in matches]}"
    return matches[0]


def secret_data(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out)
    return path
