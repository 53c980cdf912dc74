"""Worker tokens: an HMAC of the worker id under the controlplane's secret (pure).

A token names its worker, so a worker can only ever speak for itself; checking it needs no
lookup, only the secret, and compares in constant time. The operator token (the CLI's) is the
HMAC of a subject no worker id can take, so no worker token opens operator calls.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

PREFIX = "l9w1."
OPERATOR_PREFIX = "l9o1."
_OPERATOR_SUBJECT = "operator:"  # no worker id starts with it (ids are [a-z0-9-])


def worker_token(secret: str, worker_id: str) -> str:
    digest = hmac.new(secret.encode(), worker_id.encode(), hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_matches(secret: str, worker_id: str, token: str) -> bool:
    return hmac.compare_digest(worker_token(secret, worker_id).encode(), token.encode())


def operator_token(secret: str) -> str:
    """The token operators' calls to the controlplane carry (the CLI's `levers9 task logs`)."""
    digest = hmac.new(secret.encode(), _OPERATOR_SUBJECT.encode(), hashlib.sha256).digest()
    return OPERATOR_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def operator_token_matches(secret: str, token: str) -> bool:
    return hmac.compare_digest(operator_token(secret).encode(), token.encode())
