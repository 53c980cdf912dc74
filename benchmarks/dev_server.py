"""The Temporal dev server a benchmark started (its own child `temporal`): its CPU seconds."""

from __future__ import annotations

import os
from pathlib import Path


def server_cpu() -> float:
    """CPU seconds of this process's child `temporal` (the dev server), from /proc."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if name == "temporal" and int(fields[1]) == os.getpid():
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
