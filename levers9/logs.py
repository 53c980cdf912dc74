"""One logging setup for every levers9 process: `<time> <level> <message> key=value ...`.

The spec quotes lines such as
`loaded controller gpu_type=RTXPro6000 mode=external pool_name=gke-rtx6000`; they are emitted
verbatim after the timestamp and level: the message, then the fields in the order the call site
gave them. Lists and maps render as compact JSON (`dirs=["/usr/local/nvidia/lib64"]`), strings
that need it are double-quoted (`error="invalid provider name"`).

structlog loggers (`get_logger`) and stdlib records (the Temporal SDK, `workflow.logger` with
`extra={"kv": {...}}`) go through the same renderer.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

from pydantic import SecretBytes, SecretStr

KV_EXTRA = "kv"
"""The `extra` key under which stdlib callers (workflows) pass their fields."""

_MASK = "**********"
# Loggers whose lines are ours (the workflows' go through the SDK's workflow logger).
_OWN_LOGGERS = ("levers9", "root", "temporalio.workflow", "temporalio.activity")
_NEEDS_QUOTES = frozenset(' "=\t\n\\')


def format_value(value: object) -> str:
    """Renders one value as logfmt: bare when safe, double-quoted JSON string otherwise."""
    if isinstance(value, SecretStr | SecretBytes):
        return _MASK
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple | dict):
        text = json.dumps(value, separators=(",", ":"), default=str)
        return json.dumps(text) if " " in text else text
    text = str(value)
    if text == "" or any(ch in _NEEDS_QUOTES for ch in text):
        return json.dumps(text)
    return text


def format_line(message: str, fields: Mapping[str, object]) -> str:
    """`message key=value ...`, the part of a log line the spec quotes."""
    pairs = " ".join(f"{key}={format_value(value)}" for key, value in fields.items())
    return f"{message} {pairs}" if pairs else message


def _prefix(level: str) -> str:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{now} {level.upper():<5}"


def _render(_: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
    message = str(event_dict.pop("event", ""))
    level = str(event_dict.pop("level", method))
    return f"{_prefix(level)} {format_line(message, event_dict)}"


class LineFormatter(logging.Formatter):
    """Renders stdlib records (Temporal SDK, workflow.logger) like structlog lines."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = dict(getattr(record, KV_EXTRA, None) or {})
        if not record.name.startswith(_OWN_LOGGERS):
            fields.setdefault("logger", record.name)
        line = f"{_prefix(record.levelname)} {format_line(record.getMessage(), fields)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_wanted: tuple[str, TextIO] | None = None
"""What `setup` asked for, kept for structlog when it is loaded after `setup` (lazily: a CLI
command that logs nothing never loads it)."""


def setup(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Configures structlog and the stdlib root logger; safe to call more than once."""
    global _wanted
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(LineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    _wanted = (level, out)
    if "structlog" in sys.modules:
        _configure_structlog(level, out)
    if "temporalio" in sys.modules:
        quiet_sdk_messages()


def _configure_structlog(level: str, out: TextIO) -> None:
    global _wanted
    import structlog

    _wanted = None
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def quiet_sdk_messages() -> None:
    """The SDK appends workflow/activity info to every message; the spec's lines are verbatim.
    `setup` calls this when the SDK is loaded; `levers9.temporal` when it loads the SDK later
    (the CLI and the agent never load it to log)."""
    from temporalio import activity, workflow

    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def get_logger(name: str = "levers9") -> Any:
    """A structlog logger; `log.info("loaded controller", gpu_type=..., ...)`."""
    import structlog

    if _wanted is not None:
        _configure_structlog(*_wanted)
    return structlog.get_logger(name)
