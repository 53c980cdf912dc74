"""The values schema: a merged values document validated into the pools that load, the pools
that do not (`PoolProblem`, one per error line) and the controlplane settings (`Values`).
Unknown keys above the pools are typos and refused; every error names its field path."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from levers9.config.errors import ConfigError, describe_validation_error
from levers9.config.loading import load_values
from levers9.config.pool import PROVIDER, PoolConfig
from levers9.config.settings import ControlplaneSettings

POOLS_PATH = ("config", "worker", "pools")
CONTROLPLANE_PATH = ("config", "controlplane")
INVALID_PROVIDER = "invalid provider name"

_POOL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class PoolProblem:
    """A pool that did not load: `error` is the spec's `error=` value."""

    pool_name: str
    error: str


@dataclass(frozen=True)
class Values:
    """Everything the values files say, validated."""

    pools: Mapping[str, PoolConfig]
    problems: Sequence[PoolProblem]
    settings: ControlplaneSettings


def _dig(doc: Mapping[str, Any], path: Sequence[str]) -> tuple[Any, str | None]:
    node: Any = doc
    for depth, key in enumerate(path):
        if node is None:
            return None, None
        if not isinstance(node, Mapping):
            return None, f"{'.'.join(path[:depth])}: must be a map"
        node = node.get(key)
    if node is not None and not isinstance(node, Mapping):
        return None, f"{'.'.join(path)}: must be a map"
    return node, None


def joined_pool(name: str, block: Any) -> PoolConfig:
    """A joined cluster's pool (`levers9.providers.joined.pool_block`)."""
    pool = parse_pool(name, block)
    pool.kubernetes._joined = True
    return pool


def parse_pool(name: str, block: Any) -> PoolConfig:
    """Validates one pool block; raises ConfigError naming the field on bad input."""
    prefix = ".".join((*POOLS_PATH, name))
    if not _POOL_NAME.match(name):
        raise ConfigError(
            [f"{prefix}: a pool name is lowercase letters, digits and '-', at most 40 long"]
        )
    if not isinstance(block, Mapping):
        raise ConfigError([f"{prefix}: must be a map"])
    if block.get("provider") != PROVIDER:
        kube = block.get("kubernetes")
        only_credentials = (
            set(block) == {"kubernetes"}
            and isinstance(kube, Mapping)
            and bool(kube)
            and set(kube) <= {"credentials", "credentialsFile"}
        )
        if only_credentials:
            # The spec's line, and why: a private values file for a pool of another name.
            raise ConfigError(
                [
                    INVALID_PROVIDER,
                    f"{prefix}: only credentials here: a private values file names a pool"
                    " the other values files do not have (check the pool's name in both)",
                ]
            )
        if block.get("provider") is None:
            # `{}`, or a block that lost its first lines: say where (another provider's pool
            # is the spec's line alone: it belongs to another part of the controlplane).
            raise ConfigError(
                [INVALID_PROVIDER, f"{prefix}.provider: required: write provider: {PROVIDER}"]
            )
        raise ConfigError([INVALID_PROVIDER])
    try:
        return PoolConfig.model_validate(block)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(prefix, exc)) from None


def parse_settings(doc: Mapping[str, Any]) -> ControlplaneSettings:
    """Controlplane settings from `config.controlplane`, overridden by the environment."""
    block, problem = _dig(doc, CONTROLPLANE_PATH)
    if problem:
        raise ConfigError([problem])
    try:
        return ControlplaneSettings(**dict(block or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(".".join(CONTROLPLANE_PATH), exc)) from None


KNOWN_ABOVE_POOLS: Mapping[tuple[str, ...], frozenset[str]] = {
    ("config",): frozenset({"controlplane", "worker"}),
    ("config", "worker"): frozenset({"pools"}),
}
"""What `config` and `config.worker` hold; anything else there is a typo (`config.wrker`).
Keys beside `config` are the Helm chart's own (`replicaCount`, `image`, ...) and pass."""


def _unknown_above_pools(doc: Mapping[str, Any]) -> list[str]:
    problems = []
    for path, known in KNOWN_ABOVE_POOLS.items():
        block, _ = _dig(doc, path)
        for key in block or {}:
            if key not in known:
                problems.append(
                    f"{'.'.join(path)}.{key}: unknown field (check its spelling against"
                    f" docs/configuration.md; {'.'.join(path)} holds {', '.join(sorted(known))})"
                )
    return problems


def parse_values(doc: Mapping[str, Any]) -> Values:
    """Validates merged values: pools that load, pools that do not, controlplane settings."""
    unknown = _unknown_above_pools(doc)
    if unknown:
        raise ConfigError(unknown)
    settings = parse_settings(doc)
    block, problem = _dig(doc, POOLS_PATH)
    if problem:
        raise ConfigError([problem])
    pools: dict[str, PoolConfig] = {}
    problems: list[PoolProblem] = []
    for name, pool_block in (block or {}).items():
        try:
            pools[str(name)] = parse_pool(str(name), pool_block)
        except ConfigError as exc:
            problems += [PoolProblem(str(name), line) for line in exc.errors]
    return Values(pools=pools, problems=problems, settings=settings)


def load(paths: Sequence[Path]) -> Values:
    """Loads values files (merged in order) into validated pools and settings."""
    return parse_values(load_values(paths))
