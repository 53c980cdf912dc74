"""What the gateway's token check adds to a call: `Authority.identify` (levers9/gateway/roles.py),
the one step a call with a workspace token takes that a call with the operator's does not,
timed over many calls on one core.

    python benchmarks/tokens.py [--calls 20000]

A workspace token's record is read from Temporal (one describe of `workspace:<name>`) at most
once per TOKEN_CACHE_TTL_S per replica; every other call checks the token against the cached
record: parse, SHA-256 of the secret, a constant-time compare, the expiry. This times that
path (the record served from the cache, as it is for all but one call in 2 s) and the
operator's (an HMAC compare), and prints p50 and p99 of each, in microseconds. Target (issue
37): at most 0.2 ms p50 added to a gateway call.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from datetime import UTC, datetime

from pydantic import SecretStr

from levers9.core.workspaces import WorkspaceState, WorkspaceToken, token_digest, workspace_token
from levers9.gateway.roles import Authority
from levers9.tokens import operator_token

SECRET = "bench-secret-" + "x" * 32


class CachedRecords:
    """Stands in for TemporalWorkspaceRecords on the cached path: the Authority reads the
    record once (as it would from Temporal) and then serves it from its own cache."""

    def __init__(self, state: WorkspaceState) -> None:
        self._state = state
        self.reads = 0

    async def get(self, name: str) -> WorkspaceState | None:
        self.reads += 1
        return self._state if name == self._state.name else None

    async def token_used(self, name: str, token_id: str) -> None:
        return None


async def _time(authority: Authority, token: str, calls: int) -> list[float]:
    metadata = [("authorization", f"Bearer {token}")]
    spent = []
    for _ in range(calls):
        started = time.perf_counter()
        await authority.identify(metadata)
        spent.append((time.perf_counter() - started) * 1e6)
    return spent


async def main(calls: int) -> None:
    secret = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    state = WorkspaceState(
        name="team-a",
        created_at=now,
        tokens=[
            WorkspaceToken(token_id="abcdef012345", digest=token_digest(secret), created_at=now)
        ],
    )
    records = CachedRecords(state)
    authority = Authority(SecretStr(SECRET), workspaces=records, cache_ttl_s=3600)  # type: ignore[arg-type]
    workspace = workspace_token("team-a", "abcdef012345", secret)
    operator = operator_token(SECRET, 1)
    for name, token in (("operator", operator), ("workspace (cached record)", workspace)):
        spent = await _time(authority, token, calls)
        p99 = statistics.quantiles(spent, n=100)[98]
        print(f"{name}: p50 {statistics.median(spent):.1f} us, p99 {p99:.1f} us ({calls} calls)")
    print(f"records read: {records.reads} (once; every other call from the cache)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().calls))
