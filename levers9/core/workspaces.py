"""Workspaces: a team's share of the controlplane, and the record WorkspaceWorkflow keeps of one
(`workspace:<name>`): its limits and its tokens' hashes (pure).

A workspace token is `l9k1.<workspace>.<token id>.<secret>`, the secret 256 random bits; the
record keeps the SHA-256 of the secret (`digest`), the label, when it was made, when it expires,
when it was last used and when it was revoked. Never the token: not in a workflow's history, a
memo, a log line or a Secret. The workspace and the token id in the token tell the gateway which
record to read, so checking one is one read (cached a few seconds), never a scan.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

from pydantic import BaseModel, Field

from levers9.contract import DNS_LABEL

WORKSPACE_WORKFLOW = "WorkspaceWorkflow"
DEFAULT_WORKSPACE = "default"
"""The workspace of what the operator runs without naming one."""
MAX_NAME_CHARS = 40
"""A workspace's name is a DNS label of at most this many characters (it prefixes ids)."""
MAX_LABEL_CHARS = 63
MAX_TOKENS = 50
"""Tokens a record keeps (live, then the newest revoked or expired): its memo stays small."""
TOKEN_PREFIX = "l9k1."
TOKEN_ID_CHARS = 12


def workspace_workflow_id(name: str) -> str:
    return f"workspace:{name}"


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a workspace (None: it can)."""
    if not name:
        return "missing: a workspace is named by a DNS label, e.g. team-a"
    if len(name) > MAX_NAME_CHARS:
        return f"{name[:MAX_NAME_CHARS]}...: at most {MAX_NAME_CHARS} characters"
    if not DNS_LABEL.fullmatch(name):
        return (
            f"{name!r} is not a DNS label: lowercase letters, digits and '-', starting and"
            " ending with a letter or digit, e.g. team-a"
        )
    return None


def token_digest(secret: str) -> str:
    """The SHA-256 (hex) of a workspace token's secret: all the controlplane keeps of it."""
    return hashlib.sha256(secret.encode()).hexdigest()


def workspace_token(workspace: str, token_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}{workspace}.{token_id}.{secret}"


def parse_token(token: str) -> tuple[str, str, str] | None:
    """(workspace, token id, secret) of a workspace token; None when `token` is none."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    parts = token.removeprefix(TOKEN_PREFIX).split(".")
    if len(parts) != 3 or not all(parts) or name_problem(parts[0]) is not None:
        return None
    return parts[0], parts[1], parts[2]


class WorkspaceToken(BaseModel):
    """One token of a workspace, as its record keeps it: the hash of its secret, never it."""

    token_id: str
    label: str = ""
    digest: str
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    def refusal(self, secret: str, now: datetime) -> str:
        """ "" when `secret` is this token's and it is usable at `now`; else why not."""
        if not hmac.compare_digest(token_digest(secret), self.digest):
            return "not a token of this workspace"
        if self.revoked_at is not None:
            return f"revoked at {self.revoked_at.isoformat(timespec='seconds')}"
        if self.expires_at is not None and now >= self.expires_at:
            return f"expired at {self.expires_at.isoformat(timespec='seconds')}"
        return ""

    def live(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


MAX_WEIGHT = 1000
"""A workspace's fair-share weight is 1 to this."""


class WorkspaceLimits(BaseModel):
    """`workspace set`: the limits to change (None: as they are)."""

    gpu_quota: int | None = Field(default=None, ge=0)
    max_queued: int | None = Field(default=None, ge=0)
    weight: int | None = Field(default=None, ge=1, le=MAX_WEIGHT)
    default_pool: str | None = None
    """The pool its tasks go to without `--pool` ("": none); the gateway checks it names one."""


class WorkspaceState(BaseModel):
    """WorkspaceWorkflow's state and record; carried across continue-as-new as it is."""

    name: str
    gpu_quota: int | None = Field(default=None, ge=0)
    """The most GPUs its work may hold at once; None: no quota."""
    max_queued: int | None = Field(default=None, ge=0)
    """The most tasks it may keep waiting; None: no bound."""
    weight: int = Field(default=1, ge=1, le=MAX_WEIGHT)
    """Its fair share against the other waiting workspaces (dominant share: GPUs held over
    weight); 1 unless set."""
    created_at: datetime
    default_pool: str = ""
    """Where its tasks go when `levers9 run` is given no `--pool` ("": the only pool)."""
    tokens: list[WorkspaceToken] = Field(default_factory=list)
    deleting: bool = False

    def set_limits(self, limits: WorkspaceLimits) -> None:
        if limits.gpu_quota is not None:
            self.gpu_quota = limits.gpu_quota
        if limits.max_queued is not None:
            self.max_queued = limits.max_queued
        if limits.weight is not None:
            self.weight = limits.weight
        if limits.default_pool is not None:
            self.default_pool = limits.default_pool

    def token(self, token_id: str) -> WorkspaceToken | None:
        return next((t for t in self.tokens if t.token_id == token_id), None)

    def add_token(self, token: WorkspaceToken, now: datetime) -> str:
        """ "" when `token` is kept now; else why not. Past MAX_TOKENS the oldest revoked or
        expired one is forgotten; live ones never are."""
        if self.deleting:
            return f"workspace {self.name} is being deleted"
        if self.token(token.token_id) is not None:
            return f"token id {token.token_id} exists already"
        if len(self.tokens) >= MAX_TOKENS:
            dead = [t for t in self.tokens if not t.live(now)]
            if not dead:
                return (
                    f"workspace {self.name} holds {MAX_TOKENS} live tokens: revoke one first"
                    f" (`levers9 workspace token list {self.name}`)"
                )
            self.tokens.remove(min(dead, key=lambda t: t.created_at))
        self.tokens.append(token)
        return ""

    def revoke(self, token_id: str, now: datetime) -> str:
        """ "" when the token is revoked now (or was already); else why not."""
        token = self.token(token_id)
        if token is None:
            return f"workspace {self.name} has no token {token_id}"
        if token.revoked_at is None:
            token.revoked_at = now
        return ""

    def used(self, token_id: str, now: datetime) -> bool:
        """Records the token's last use; False when there is no such token."""
        token = self.token(token_id)
        if token is None:
            return False
        token.last_used_at = now
        return True
