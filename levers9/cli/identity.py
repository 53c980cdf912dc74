"""Who a command is, and where it reaches the controlplane's gateway, as kubectl picks a context.

In order, the first that says wins:

- the token: `LEVERS9_TOKEN`, then `LEVERS9_API_TOKEN` / `LEVERS9_API_TOKEN_FILE` set in the
  shell (scripts, CI), then the profile's, then the dev stack's env file's (`levers9 dev up`);
- the gateway: `LEVERS9_GATEWAY_ADDRESS` (with `LEVERS9_GATEWAY_TLS[_CA_FILE]`) set in the shell,
  then the profile's, then the dev stack's env file's;
- the profile: `--profile NAME` (or `LEVERS9_PROFILE`), then the file's current one
  (`levers9.profiles`: `levers9 login` writes it, `levers9 profile use` picks it).

A variable that the dev stack's env file supplied is not one the shell set: a profile beats it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from levers9.cli.runtime import CliState
from levers9.config import ControlplaneSettings
from levers9.profiles import Profile, ProfileError, config_path, name_problem, read_profiles

TOKEN_VARIABLE = "LEVERS9_TOKEN"
DEV_ENV_SOURCE = "the dev stack's env file (levers9 dev up)"


@dataclass(frozen=True)
class Identity:
    """The settings a command dials the gateway with, and where their parts came from."""

    settings: ControlplaneSettings
    profile: str | None
    """The profile in effect (None: none was)."""
    token_source: str
    address_source: str


def selected_profile(
    state: CliState, path: Path | None = None, *, missing_ok: bool = False
) -> tuple[str, Profile] | None:
    """The profile in effect: `--profile`, else the file's current one; None when neither is
    (or, `missing_ok`, when the file lacks the one named). ProfileError naming the file and the
    fix when it cannot be read or lacks the name."""
    path = path or config_path()
    profiles = read_profiles(path)
    if state.profile is not None:
        problem = name_problem(state.profile)
        if problem is not None:
            raise ProfileError(f"--profile: {problem}")
    name = state.profile or profiles.current
    if name is None:
        return None
    profile = profiles.profiles.get(name)
    if profile is None and missing_ok:
        return None
    if profile is None:
        known = ", ".join(sorted(profiles.profiles)) or "none"
        raise ProfileError(
            f"no profile {name} in {path} (it holds {known}):"
            f" levers9 login --profile {name} --token TOKEN writes one"
        )
    return name, profile


def resolve(
    settings: ControlplaneSettings, state: CliState, *, missing_ok: bool = False
) -> Identity:
    """`settings` (from the environment) with the profile and LEVERS9_TOKEN applied."""
    chosen = selected_profile(state, missing_ok=missing_ok)
    update: dict[str, object] = {}
    address_source = "the default address (gatewayAdvertisedAddress)"
    if state.from_shell("LEVERS9_GATEWAY_ADDRESS"):
        address_source = "LEVERS9_GATEWAY_ADDRESS"
    elif chosen is not None:
        name, profile = chosen
        update["gateway_address"] = profile.controlplane
        address_source = f"profile {name}"
        tls_keys = ("LEVERS9_GATEWAY_TLS", "LEVERS9_GATEWAY_TLS_CA_FILE")
        if not any(state.from_shell(key) for key in tls_keys):
            update["gateway_tls"] = profile.tls
            update["gateway_tls_ca_file"] = profile.ca_file
    elif "LEVERS9_GATEWAY_ADDRESS" in state.dev_keys:
        address_source = DEV_ENV_SOURCE
    token_source = "none"
    if os.environ.get(TOKEN_VARIABLE):
        update["api_token"] = SecretStr(os.environ[TOKEN_VARIABLE])
        update["api_token_file"] = None
        token_source = TOKEN_VARIABLE
    elif state.from_shell("LEVERS9_API_TOKEN"):
        token_source = "LEVERS9_API_TOKEN"
    elif state.from_shell("LEVERS9_API_TOKEN_FILE"):
        token_source = "LEVERS9_API_TOKEN_FILE"
    elif chosen is not None:
        update["api_token"] = chosen[1].token
        update["api_token_file"] = None
        token_source = f"profile {chosen[0]}"
    elif "LEVERS9_API_TOKEN_FILE" in state.dev_keys:
        token_source = DEV_ENV_SOURCE
    elif settings.operator_token() is not None:
        token_source = "the worker token secret (the controlplane's own machine)"
    return Identity(
        settings=settings.model_copy(update=update) if update else settings,
        profile=chosen[0] if chosen is not None else None,
        token_source=token_source,
        address_source=address_source,
    )
