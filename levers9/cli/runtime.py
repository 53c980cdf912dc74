"""What every `levers9` command shares: the dev env file, settings, logging."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from levers9.home import state_home

if TYPE_CHECKING:
    from levers9.cli.identity import Identity
    from levers9.config import ControlplaneSettings


def read_env_file(path: Path) -> dict[str, str]:
    """Parses the `export KEY=value` lines `levers9 dev up` writes."""
    exported = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            exported[key] = value
    return exported


DEV_ENV_SUPPLIED = "LEVERS9_DEV_ENV_SUPPLIED"
"""The variables the dev env file supplied (comma-separated): a profile beats those, not the
shell's. In the environment, so that a `levers9` this one starts knows them too."""


@dataclass(frozen=True)
class CliState:
    """What the top-level command learnt before any subcommand ran."""

    profile: str | None = None
    """`--profile` (or LEVERS9_PROFILE)."""
    dev_keys: frozenset[str] = field(default_factory=frozenset)
    """The variables the dev stack's env file supplied, not the shell."""

    def from_shell(self, key: str) -> bool:
        return bool(os.environ.get(key)) and key not in self.dev_keys


def honour_dev_env() -> None:
    """Takes `.levers9/dev/env` as defaults: variables already set in the shell win. Those it
    set are named in LEVERS9_DEV_ENV_SUPPLIED (a profile beats them, not the shell's)."""
    env_file = state_home() / "dev" / "env"
    supplied = set(cli_state().dev_keys)
    if env_file.is_file():
        for key, value in read_env_file(env_file).items():
            if key not in os.environ:
                os.environ[key] = value
                supplied.add(key)
    if supplied:
        os.environ[DEV_ENV_SUPPLIED] = ",".join(sorted(supplied))


def cli_state() -> CliState:
    """The command's `--profile` (LEVERS9_PROFILE) and the dev env file's variables."""
    named = os.environ.get(DEV_ENV_SUPPLIED, "")
    return CliState(
        profile=os.environ.get("LEVERS9_PROFILE") or None,
        dev_keys=frozenset(key for key in named.split(",") if key),
    )


def identity_from_env(*, missing_ok: bool = False) -> Identity:
    """The command's settings with its profile and LEVERS9_TOKEN applied, and where each part
    came from; a broken profile file is printed, naming the file and the fix, exit status 1.
    `missing_ok`: a profile named but not in the file is as none (`levers9 login` writes it)."""
    from levers9.cli.identity import resolve
    from levers9.cli.output import fail
    from levers9.config import ConfigError, parse_settings
    from levers9.profiles import ProfileError

    try:
        return resolve(parse_settings({}), cli_state(), missing_ok=missing_ok)
    except (ConfigError, ProfileError) as exc:
        fail(exc.errors if isinstance(exc, ConfigError) else [str(exc)])
        raise typer.Exit(1) from None


def settings_from_env() -> ControlplaneSettings:
    """Controlplane settings from the environment (and the dev env file), with the profile in
    effect and LEVERS9_TOKEN applied (`levers9.cli.identity`)."""
    return identity_from_env().settings


def key_values(pairs: list[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` options (`--env`, `--node-selector`) as a map; a bad one names the option."""
    import typer

    values = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise typer.BadParameter(f"{pair!r}: give KEY=VALUE", param_hint=option)
        values[key] = value
    return values


def environment(pairs: list[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` environment options (`--env`): each KEY a variable name a shell can use."""
    import typer

    from levers9.contract import ENV_NAME

    values = key_values(pairs, option)
    for key in values:
        if not ENV_NAME.fullmatch(key):
            raise typer.BadParameter(
                f"{key!r} is not a variable name: letters, digits and _, not starting with a digit",
                param_hint=option,
            )
    return values


def labels(pairs: list[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` label options (`--node-selector`): each as Kubernetes takes a label, else
    the option and what is wrong (`k=v=w`: a value holds no `=`)."""
    import typer

    from levers9.contract import label_problem

    values = key_values(pairs, option)
    for key, value in values.items():
        problem = label_problem(key, value)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint=option)
    return values


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration(text: str, option: str) -> float:
    """A duration option (`90`, `90s`, `25m`, `1h`) in seconds; anything else, or not above
    zero, names the option."""
    import typer

    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise typer.BadParameter(
            f"{text!r}: a duration above zero, like 90s, 25m or 1h", param_hint=option
        )
    return seconds
