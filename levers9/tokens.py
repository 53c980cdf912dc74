"""Worker tokens: an HMAC of the worker id under the controlplane's secret (pure).

A token names its worker, so a worker can only ever speak for itself; checking it needs no
lookup, only the secret, and compares in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

PREFIX = "l9w1."


def worker_token(secret: str, worker_id: str) -> str:
    digest = hmac.new(secret.encode(), worker_id.encode(), hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_matches(secret: str, worker_id: str, token: str) -> bool:
    return hmac.compare_digest(worker_token(secret, worker_id).encode(), token.encode())
