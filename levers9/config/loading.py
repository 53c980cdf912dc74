"""Loading and merging values files like `helm -f a -f b`: YAML (JSON is a subset), maps merged
deeply, later wins, `null` deletes a key; a key written twice, a document nested too deep or a
file that is not a map is refused naming the file (and the line)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from levers9.config.errors import ConfigError


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merges like helm: maps deeply, anything else replaced, `null` deletes the key."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_values_file(path: Path) -> dict[str, Any]:
    """One values file (YAML, which JSON is a subset of) as a map."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{path}: not UTF-8 text (byte {exc.start}): values files are YAML or JSON"]
        ) from None
    import yaml  # values files only: the CLI's settings come from the environment

    try:
        doc = yaml.load(text, Loader=_values_loader())
    except DuplicateKey as exc:
        raise ConfigError([f"{path}: {exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError([f"{path}: not valid YAML or JSON{where}"]) from None
    except RecursionError:
        doc = _TOO_DEEP
    if doc is _TOO_DEEP or _depth(doc) > MAX_DEPTH:
        raise ConfigError(
            [
                f"{path}: nested more than {MAX_DEPTH} deep: values are a few maps deep (config:"
                " worker: pools: <name>: ...)"
            ]
        )
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([f"{path}: the top level must be a map (config: ...)"])
    return doc


MAX_DEPTH = 64
"""The deepest a values document may nest (maps and lists): the pool block is six deep; a
deeper document is refused before anything recurses into it."""
_TOO_DEEP = object()


def _depth(doc: Any) -> int:
    """How deep maps and lists nest in `doc`, counted without recursion (stops past
    MAX_DEPTH)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(node, Mapping):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


class DuplicateKey(Exception):
    """A YAML map that holds a key twice (YAML forbids it; PyYAML would keep the last)."""


def _values_loader() -> type:
    """yaml.SafeLoader, refusing a key written twice in one map, naming it and both lines."""
    import yaml

    class ValuesLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<:` merges; keys written beside it override, as YAML says
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: the constructor refuses it below
                    if first is not None:
                        raise DuplicateKey(
                            f"key {key!r:.80} is written twice in one map (lines {first} and"
                            f" {line}): keep one (YAML keeps no duplicate; the last would win)"
                        )
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return ValuesLoader


def load_values(paths: Iterable[Path]) -> dict[str, Any]:
    """Reads and merges values files in order, like `helm -f a -f b`."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge_values(merged, read_values_file(path))
    return merged
