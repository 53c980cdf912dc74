"""Where levers9 keeps its state on the operator's machine: `$LEVERS9_HOME`, else `.levers9` in
the working directory (the dev stack's state lives under its `dev/`).

Shared by the CLI (the dev env file it honours) and the dev stack (`levers9.devstack`), which
imports nothing of the CLI (.importlinter)."""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """`$LEVERS9_HOME`, else `.levers9` in the current directory (the dev stack's state)."""
    return Path(os.environ.get("LEVERS9_HOME") or ".levers9").absolute()
