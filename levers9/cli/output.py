"""Lists as rich tables for people, `-o json` for scripts."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 200
"""Width when output goes to a pipe or file, so tables are not squeezed to 80 columns."""


def _console(stderr: bool = False) -> Console:
    made = Console(stderr=stderr)
    if not made.is_terminal:
        made.width = PIPE_WIDTH
    return made


console = _console()
errors = _console(stderr=True)


class Output(enum.StrEnum):
    table = "table"
    json = "json"


def render(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[tuple[str, str]],
    output: Output,
    title: str | None = None,
) -> None:
    """Prints rows as a table (columns are `(key, header)`) or as a JSON list."""
    if output is Output.json:
        console.print_json(json.dumps(list(rows), default=str))
        return
    table = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for _, header in columns:
        table.add_column(header)
    for row in rows:
        table.add_row(*("" if row.get(key) is None else str(row.get(key)) for key, _ in columns))
    console.print(table)


def fail(lines: Sequence[str]) -> None:
    for line in lines:
        errors.print(f"[red]error:[/red] {line}", highlight=False, markup=True, soft_wrap=True)


def ago(moment: datetime | None, now: datetime) -> str:
    """`42s`, `3m`, `2h`: how long ago, as kubectl prints ages."""
    if moment is None:
        return ""
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
