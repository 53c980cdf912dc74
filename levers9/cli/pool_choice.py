"""`--pool` left out: the caller's workspace's default pool when it has one (`levers9 workspace
set NAME --default-pool P`), else the only pool when the controlplane has exactly one, else a
refusal naming the pools there are. The gateway lists them, and says the default, for any token
(a workspace's has no way into Temporal); without a token, or with a gateway that does not
answer, Temporal's schedules do (no default then)."""

from __future__ import annotations

import asyncio

import typer

from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable, NoToken, pool_names
from levers9.config import ControlplaneSettings
from levers9.errors import Unreachable


async def _listed(settings: ControlplaneSettings) -> tuple[list[str], str]:
    try:
        return await pool_names(settings)
    except GatewayUnavailable as unavailable:
        from levers9 import temporal

        try:
            client = await temporal.connect(settings)
        except Unreachable:  # neither way answers: the gateway's reason is the one to fix
            if isinstance(unavailable, NoToken):
                raise  # unless there was no token to ask it with
            raise unavailable from None
        return await temporal.pool_names(client, settings.task_queue), ""


def chosen_pool(settings: ControlplaneSettings, given: str | None, option: str = "--pool") -> str:
    """`given`, else the caller's workspace's default pool, else the controlplane's only pool;
    BadParameter naming `option` and the pools when there is not exactly one, or when they
    cannot be listed."""
    if given is not None:
        return given
    try:
        names, default = asyncio.run(_listed(settings))
    except (GatewayRefused, GatewayUnavailable) as exc:
        raise typer.BadParameter(
            f"give {option} NAME: the pools could not be listed ({exc})", param_hint=option
        ) from None
    if default:
        return default
    if len(names) == 1:
        return names[0]
    if not names:
        raise typer.BadParameter(
            "this controlplane has no pool yet (`levers9 pool list`)", param_hint=option
        )
    raise typer.BadParameter(
        f"give {option} NAME, one of this controlplane's pools: {', '.join(names)} (or set"
        " your workspace's default: levers9 workspace set NAME --default-pool POOL)",
        param_hint=option,
    )
