"""How the values block reports what is wrong: `ConfigError`'s `<field path>: <what is wrong>`
lines, and a pydantic error turned into them without the offending input."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError


class ConfigError(Exception):
    """Values that cannot be used; `errors` are `<field path>: <what is wrong>` lines."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


def describe_validation_error(prefix: str, error: ValidationError) -> list[str]:
    """`<prefix>.<field path>: <message>` for each error, without the offending input."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in item["loc"])
        path = f"{prefix}.{loc}" if loc else prefix
        message = item["msg"]
        if item["type"] == "value_error":
            message = str(item.get("ctx", {}).get("error", message))
        elif item["type"] == "missing":
            message = "required"
        elif item["type"] == "extra_forbidden":
            message = "unknown field (check its spelling against docs/configuration.md)"
        lines.append(f"{path}: {message}")
    return lines
