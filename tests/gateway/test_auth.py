"""Worker tokens from call metadata (pure): exactly one `authorization: Bearer <token>`, and it
must be the token of the worker id the request names; refusals never quote the token."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from levers9.gateway.auth import authenticate, bearer_token
from levers9.gateway.errors import Unauthenticated
from levers9.tokens import worker_token

SECRET = SecretStr("auth-unit-secret")
TOKEN = worker_token(SECRET.get_secret_value(), "w1")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    assert bearer_token([("authorization", f"{scheme} {TOKEN}")]) == TOKEN


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ([], "missing token"),
        ([("x-other", "Bearer t")], "missing token"),
        ([("authorization", f"Bearer {TOKEN}")] * 2, "more than one"),
        ([("authorization", f"Basic {TOKEN}")], "not a bearer token"),
        ([("authorization", TOKEN)], "not a bearer token"),
        ([("authorization", TOKEN.encode())], "not a bearer token"),
        ([("authorization", "Bearer  ")], "empty bearer token"),
    ],
)
def test_malformed_authorization(metadata: list[tuple[str, str | bytes]], problem: str) -> None:
    with pytest.raises(Unauthenticated, match=problem) as caught:
        bearer_token(metadata)
    assert TOKEN not in caught.value.message


def test_own_token_passes() -> None:
    authenticate(SECRET, "w1", [("authorization", f"Bearer {TOKEN}")])


@pytest.mark.parametrize(
    "token",
    [
        worker_token(SECRET.get_secret_value(), "w2"),
        worker_token("another-secret", "w1"),
        TOKEN + "x",
        TOKEN[:-1],
    ],
    ids=["other-worker", "other-secret", "longer", "shorter"],
)
def test_any_other_token_is_refused_without_quoting_it(token: str) -> None:
    with pytest.raises(Unauthenticated, match="does not match worker_id") as caught:
        authenticate(SECRET, "w1", [("authorization", f"Bearer {token}")])
    assert token not in caught.value.message
    assert SECRET.get_secret_value() not in caught.value.message
