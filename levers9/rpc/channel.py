"""Channels to the controlplane's gateway, for the agent and the CLI alike."""

from __future__ import annotations

import grpc
from grpc import aio


def gateway_channel(
    address: str, credentials: grpc.ChannelCredentials | None = None
) -> aio.Channel:
    """A channel to the gateway: TLS when `credentials` are given, plaintext otherwise."""
    if credentials is not None:
        return aio.secure_channel(address, credentials)
    return aio.insecure_channel(address)
