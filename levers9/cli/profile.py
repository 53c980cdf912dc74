"""`levers9 login`, `levers9 whoami` and `levers9 profile list|use`: the CLI's identities, as
kubectl's contexts (`levers9.profiles` keeps them; `levers9.cli.identity` says which one a
command runs as).

`login` asks the gateway who the token makes the caller before it writes anything: a token the
gateway refuses leaves the file as it was. No command here prints a token.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable, who_am_i
from levers9.cli.output import Output, console, errors, fail, render
from levers9.cli.runtime import cli_state, identity_from_env
from levers9.config import ControlplaneSettings
from levers9.profiles import (
    DEFAULT_PROFILE,
    Profile,
    ProfileError,
    Profiles,
    config_path,
    mask,
    name_problem,
    read_profiles,
    write_profiles,
)
from levers9.proto import gateway_pb2

app = typer.Typer(
    help="Profiles: which controlplane and token the CLI uses (levers9 login writes them).",
    no_args_is_help=True,
)

COLUMNS = [
    ("marker", "CURRENT"),
    ("name", "NAME"),
    ("controlplane", "CONTROLPLANE"),
    ("token", "TOKEN"),
]


SHADOWING = (
    "LEVERS9_TOKEN",
    "LEVERS9_API_TOKEN",
    "LEVERS9_API_TOKEN_FILE",
    "LEVERS9_GATEWAY_ADDRESS",
)


def _warn_shadowed(name: str) -> None:
    """Says which variables of this shell beat profile `name` (a sourced dev env file's, say)."""
    state = cli_state()
    shadowing = [key for key in SHADOWING if state.from_shell(key)]
    if shadowing:
        one = len(shadowing) == 1
        errors.print(
            f"note: {', '.join(shadowing)} set in this shell beat{'s' if one else ''} profile"
            f" {name}: unset {'it' if one else 'them'} to run as it (levers9 whoami says what a"
            " command runs as)",
            highlight=False,
            soft_wrap=True,
        )


def _profiles() -> Profiles:
    try:
        return read_profiles(config_path())
    except ProfileError as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


def _asked(settings: ControlplaneSettings) -> gateway_pb2.WhoAmIResponse:
    try:
        return asyncio.run(who_am_i(settings))
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


def _who(reply: gateway_pb2.WhoAmIResponse) -> str:
    return "operator" if reply.operator else f"workspace {reply.workspace}"


def _target(controlplane: str, settings: ControlplaneSettings) -> tuple[str, bool]:
    """`host:port` and whether to dial it with TLS: `https://` says yes, `http://` no; a bare
    address as the command would dial it now."""
    scheme, _, rest = controlplane.rpartition("://")
    if scheme not in ("", "https", "http"):
        raise typer.BadParameter(
            f"{controlplane!r}: https://host:port, http://host:port or host:port",
            param_hint="--controlplane",
        )
    address = rest.rstrip("/")
    tls = scheme == "https" if scheme else settings.gateway_uses_tls()
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or "/" in address:
        raise typer.BadParameter(
            f"{controlplane!r}: the gateway's host:port, e.g. levers9.example.com:443 or"
            " https://levers9.example.com:443",
            param_hint="--controlplane",
        )
    return address, tls


def login(
    token: Annotated[
        str,
        typer.Option(
            "--token", help="the operator's token or a workspace's; - reads it from stdin"
        ),
    ],
    controlplane: Annotated[
        str | None,
        typer.Option(
            "--controlplane",
            help="the gateway's host:port (https:// or http:// to say TLS or not);"
            " default: where this command reaches it now",
        ),
    ] = None,
    profile: Annotated[
        str, typer.Option("--profile", help="the profile to write")
    ] = DEFAULT_PROFILE,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            help="the CA of the gateway's certificate (default: the system's roots, or the"
            " one this command trusts now)",
        ),
    ] = None,
) -> None:
    """Check a token with the controlplane, then keep it as a profile, made current."""
    problem = name_problem(profile)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="--profile")
    if token == "-":
        token = sys.stdin.readline().strip()
    if not token.strip() or not token.isprintable():
        raise typer.BadParameter("an empty or unprintable token", param_hint="--token")
    if ca_file is not None and not ca_file.is_file():
        raise typer.BadParameter(f"{ca_file}: no such file", param_hint="--ca-file")
    path = config_path()
    profiles = _profiles()  # a broken file is refused before anything is asked
    now = identity_from_env(missing_ok=True).settings
    address, tls = _target(controlplane or now.cli_gateway_address(), now)
    if ca_file is None and tls:
        ca_file = now.gateway_tls_ca_file
    written = Profile(
        controlplane=address,
        tls=tls,
        ca_file=ca_file.absolute() if ca_file is not None else None,
        token=token.strip(),
    )
    candidate = now.model_copy(
        update={
            "gateway_address": address,
            "gateway_tls": tls,
            "gateway_tls_ca_file": written.ca_file,
            "api_token": written.token,
            "api_token_file": None,
        }
    )
    try:
        reply = asyncio.run(who_am_i(candidate))
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([f"login refused, {path} left as it was: {exc}"])
        raise typer.Exit(1) from None
    write_profiles(path, profiles.with_profile(profile, written, current=True))
    console.print(
        f"logged in to {address} as {_who(reply)}"
        f"{f' (token {reply.label})' if reply.label and not reply.operator else ''};"
        f" profile {profile} written to {path} and now current",
        highlight=False,
    )
    _warn_shadowed(profile)


def whoami(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """Who this command runs as: the workspace or operator, the controlplane, the token's label.

    And where each came from: LEVERS9_TOKEN, the shell, a profile, the dev stack's env file."""
    identity = identity_from_env()
    settings = identity.settings
    reply = _asked(settings)
    row = {
        "workspace": reply.workspace or None,
        "operator": reply.operator,
        "controlplane": settings.cli_gateway_address(),
        "label": reply.label,
        "token_id": reply.token_id or None,
        "default_pool": reply.default_pool or None,
        "profile": identity.profile,
        "token_from": identity.token_source,
        "controlplane_from": identity.address_source,
    }
    if output is Output.json:
        console.print_json(json.dumps(row))
        return
    lines = [
        ("workspace", reply.workspace or "operator"),
        ("controlplane", row["controlplane"]),
        ("token", reply.label or "(no label)"),
        ("default pool", reply.default_pool or "none"),
        ("profile", identity.profile or "none"),
        ("token from", identity.token_source),
        ("controlplane from", identity.address_source),
    ]
    for key, value in lines:
        console.print(f"{key + ':':<19}{value}", highlight=False)


@app.command("list")
def list_(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """Every profile of the file; the current one marked (*). Tokens are masked."""
    profiles = _profiles()
    rows = [
        {
            "marker": "*" if name == profiles.current else "",
            "name": name,
            "current": name == profiles.current,
            "controlplane": profile.controlplane,
            "tls": profile.tls,
            "ca_file": str(profile.ca_file) if profile.ca_file else None,
            "token": mask(profile.token.get_secret_value()),
        }
        for name, profile in sorted(profiles.profiles.items())
    ]
    if output is Output.json:
        for row in rows:
            row.pop("marker")
    elif not rows:
        console.print(
            f"no profiles in {config_path()}: levers9 login --token TOKEN writes one",
            highlight=False,
        )
        return
    render(rows, COLUMNS, output, title="profiles")


@app.command()
def use(name: str) -> None:
    """Make NAME the current profile: what every command runs as from now on."""
    problem = name_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="NAME")
    profiles = _profiles()
    if name not in profiles.profiles:
        fail(
            [
                f"no profile {name} in {config_path()} (it holds"
                f" {', '.join(sorted(profiles.profiles)) or 'none'}): levers9 login --profile"
                f" {name} --token TOKEN writes one"
            ]
        )
        raise typer.Exit(1)
    write_profiles(config_path(), profiles.using(name))
    console.print(f"profile {name} is current", highlight=False)
    _warn_shadowed(name)
