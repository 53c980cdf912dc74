"""Workspaces' names and tokens (pure): a name is a DNS label of at most 40 characters, a token
parses to its workspace, id and secret, and a token's record refuses another secret, a revoked
or expired token; a record keeps at most MAX_TOKENS, forgetting dead ones first, never a live
one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from levers9.core.workspaces import (
    MAX_TOKENS,
    WorkspaceState,
    WorkspaceToken,
    name_problem,
    parse_token,
    token_digest,
    workspace_token,
)

NOW = datetime(2026, 12, 5, tzinfo=UTC)


@pytest.mark.parametrize("name", ["default", "team-a", "a", "a" * 40, "0team"])
def test_a_dns_label_names_a_workspace(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "missing"),
        ("Team", "not a DNS label"),
        ("team_a", "not a DNS label"),
        ("-a", "not a DNS label"),
        ("a-", "not a DNS label"),
        ("a.b", "not a DNS label"),
        ("a" * 41, "at most 40"),
    ],
)
def test_anything_else_is_refused_saying_why(name: str, problem: str) -> None:
    assert problem in (name_problem(name) or "")


def test_a_token_parses_to_its_parts_and_nothing_else_does() -> None:
    token = workspace_token("team-a", "0123abcd", "s3cr3t")
    assert parse_token(token) == ("team-a", "0123abcd", "s3cr3t")
    for other in ("l9o1.abc", "l9k1.team-a.id", "l9k1.Team.id.s", "l9k1..id.s", token + ".x"):
        assert parse_token(other) is None


def _token(token_id: str, **fields: object) -> WorkspaceToken:
    return WorkspaceToken(token_id=token_id, digest=token_digest("s"), created_at=NOW, **fields)


def test_a_tokens_record_refuses_another_secret_a_revoked_and_an_expired_token() -> None:
    assert _token("a").refusal("s", NOW) == ""
    assert "not a token" in _token("a").refusal("x", NOW)
    assert "revoked" in _token("a", revoked_at=NOW).refusal("s", NOW)
    expired = _token("a", expires_at=NOW + timedelta(seconds=1))
    assert expired.refusal("s", NOW) == ""
    assert "expired" in expired.refusal("s", NOW + timedelta(seconds=1))


def test_a_record_forgets_dead_tokens_first_and_never_a_live_one() -> None:
    state = WorkspaceState(name="team-a", created_at=NOW)
    assert state.add_token(_token("dead", revoked_at=NOW), NOW) == ""
    for i in range(MAX_TOKENS - 1):
        assert state.add_token(_token(f"live{i}"), NOW) == ""
    assert state.add_token(_token("one-more"), NOW) == ""
    assert state.token("dead") is None
    assert len(state.tokens) == MAX_TOKENS
    assert "revoke one first" in state.add_token(_token("too-many"), NOW)
    assert "exists already" in state.add_token(_token("live0"), NOW)
    assert state.revoke("live0", NOW) == ""
    assert "no token" in state.revoke("nope", NOW)
