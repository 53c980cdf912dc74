"""One call to one of the gateway's services from a CLI command (`levers9 box`, `disk`,
`volume`, `workspace`): the stub of that service with the CLI's token, and a refusal or an
unreachable gateway printed as the one line the gateway's translation gives, exit status 1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import typer

from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable, gateway_stub
from levers9.cli.output import fail
from levers9.cli.runtime import settings_from_env

S = TypeVar("S")
T = TypeVar("T")
Metadata = tuple[tuple[str, str]]


def call_service(
    make: Callable[[grpc.aio.Channel], S], call: Callable[[S, Metadata], Awaitable[T]]
) -> T:
    """`call(stub, metadata)` on the service whose stub class is `make`; its answer."""

    async def run() -> T:
        async with gateway_stub(settings_from_env(), make) as (stub, metadata):
            return await call(stub, metadata)

    try:
        return asyncio.run(run())
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
