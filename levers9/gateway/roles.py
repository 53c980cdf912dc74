"""Who calls: the operator (its token, an HMAC under the controlplane's secret) or one workspace
(a workspace token, `levers9.core.workspaces`), checked on every call of the CLI's services.

A workspace token names its workspace and its id; the check reads that workspace's record (its
workflow's memo) and compares the SHA-256 of the token's secret with the one kept. The record is
cached for `TOKEN_CACHE_TTL_S`: a revoked token, or a deleted workspace's, is refused by every
replica within that many seconds; an expired one at once (the expiry is read at each call).
A workspace token's last use is told to its record at most once per `LAST_USE_EVERY_S` per
replica. Refusals never quote a token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import SecretStr

from levers9.core.workspaces import DEFAULT_WORKSPACE, WorkspaceState, parse_token
from levers9.gateway.auth import bearer_token
from levers9.gateway.errors import Unauthenticated
from levers9.logs import get_logger
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.tokens import operator_token_matches

TOKEN_CACHE_TTL_S = 2.0
"""How long a replica trusts a workspace's record it read: the bound on how long a revoked
token keeps working there."""
TOKEN_CACHE_SIZE = 4096
LAST_USE_EVERY_S = 60.0

log = get_logger(__name__)


@dataclass(frozen=True)
class Identity:
    """The caller: the operator (`workspace` None), or a workspace through one of its tokens."""

    workspace: str | None = None
    token_id: str = ""

    @property
    def operator(self) -> bool:
        return self.workspace is None

    @property
    def own_workspace(self) -> str:
        """The workspace the caller's tasks go to (the operator's: `default`)."""
        return self.workspace or DEFAULT_WORKSPACE

    def sees(self, workspace: str) -> bool:
        """Whether the caller may see an object of `workspace` (the operator sees all)."""
        return self.workspace is None or self.workspace == workspace


OPERATOR = Identity()


class Forbidden(Exception):
    """A workspace token on an operator call; the message names the call and the operator."""


def operator_only(identity: Identity, call: str) -> None:
    if not identity.operator:
        raise Forbidden(
            f"{call} is the operator's: a workspace token (workspace {identity.workspace}) may"
            " only run, read and stop its own workspace's tasks; ask the operator"
        )


class Authority:
    """Turns a call's bearer token into an Identity, or Unauthenticated saying why."""

    def __init__(
        self,
        secret: SecretStr,
        operator_generation: int = 1,
        workspaces: TemporalWorkspaceRecords | None = None,
        *,
        cache_ttl_s: float = TOKEN_CACHE_TTL_S,
    ) -> None:
        self._secret = secret
        self._operator_generation = operator_generation
        self._workspaces = workspaces
        self._ttl = cache_ttl_s
        self._records: dict[str, tuple[float, WorkspaceState | None]] = {}
        self._forgotten: dict[str, int] = {}
        """How often each workspace's record was dropped (`forget`)."""
        self._last_told: dict[tuple[str, str], float] = {}
        self._telling: set[asyncio.Task[None]] = set()

    async def identify(self, metadata: Iterable[tuple[str, str | bytes]]) -> Identity:
        token = bearer_token(metadata)
        if operator_token_matches(
            self._secret.get_secret_value(), token, self._operator_generation
        ):
            return OPERATOR
        parsed = parse_token(token)
        if parsed is None or self._workspaces is None:
            raise Unauthenticated(
                "operator token does not match this controlplane's secret, nor is it a"
                " workspace token: use the token `levers9 dev up` wrote (LEVERS9_API_TOKEN_FILE),"
                " LEVERS9_API_TOKEN, or a workspace's (`levers9 workspace token create`)"
            )
        workspace, token_id, secret = parsed
        state = await self._record(workspace)
        kept = state.token(token_id) if state is not None else None
        if kept is None:
            raise Unauthenticated(
                f"workspace token {token_id} is not one of workspace {workspace}'s (revoked long"
                " ago, or the workspace is gone): ask its operator for a new one"
            )
        refusal = kept.refusal(secret, datetime.now(UTC))
        if refusal:
            raise Unauthenticated(
                f"workspace token {token_id} of workspace {workspace} is refused: {refusal};"
                " ask its operator for a new one (`levers9 workspace token create`)"
            )
        self._tell_used(workspace, token_id)
        return Identity(workspace, token_id)

    async def workspace_exists(self, workspace: str) -> bool:
        """Whether `workspace` runs (as this replica read it within the cache's bound)."""
        return self._workspaces is not None and await self._record(workspace) is not None

    async def workspace(self, workspace: str) -> WorkspaceState | None:
        """The workspace's record (its limits), as this replica read it within the cache's
        bound; None when it does not run."""
        return None if self._workspaces is None else await self._record(workspace)

    def forget(self, workspace: str) -> None:
        """Drops this replica's cached record of `workspace` (it changed here), and keeps a
        read begun before the change from caching what it read."""
        self._records.pop(workspace, None)
        self._forgotten[workspace] = self._forgotten.get(workspace, 0) + 1

    async def _record(self, workspace: str) -> WorkspaceState | None:
        now = time.monotonic()
        cached = self._records.get(workspace)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        assert self._workspaces is not None
        forgotten = self._forgotten.get(workspace, 0)
        state = await self._workspaces.get(workspace)
        if self._forgotten.get(workspace, 0) != forgotten:
            return state  # changed here meanwhile: what was read may be older than the change
        if len(self._records) >= TOKEN_CACHE_SIZE:
            self._records.clear()
        self._records[workspace] = (now, state)
        return state

    def _tell_used(self, workspace: str, token_id: str) -> None:
        key = (workspace, token_id)
        now = time.monotonic()
        told = self._last_told.get(key)
        if told is not None and now - told < LAST_USE_EVERY_S:
            return
        if len(self._last_told) >= TOKEN_CACHE_SIZE:
            self._last_told.clear()
        self._last_told[key] = now
        task = asyncio.create_task(self._signal_used(workspace, token_id))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _signal_used(self, workspace: str, token_id: str) -> None:
        assert self._workspaces is not None
        try:
            await self._workspaces.token_used(workspace, token_id)
        except Exception as exc:  # a last-use stamp is best effort; the call goes on
            log.warning(
                "could not record a token's last use",
                workspace=workspace,
                token_id=token_id,
                error=type(exc).__name__,
            )
