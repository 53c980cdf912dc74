"""The dashboard's sessions: the token a user signed in with, sealed into a cookie.

The cookie holds the token and the session's expiry, sealed with AES-GCM under a key derived
(HKDF-SHA256) from the controlplane's secret, so every replica opens it and nothing is kept
server side; the browser never sees the token (and the cookie is `HttpOnly`). The token is
checked again by the gateway's `Authority` on every call the page makes: a revoked token ends
its sessions within the Authority's cache bound.

Every state-changing request is a POST carrying a CSRF token: the HMAC of the session's cookie
(before sign-in: of a random `l9_csrf` cookie), so a form of another site, which cannot read the
cookie, cannot forge it. The cookies are also `SameSite=Strict`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SESSION_COOKIE = "l9_session"
PRE_COOKIE = "l9_csrf"
"""The sign-in form's own CSRF cookie (random, before there is a session)."""
SESSION_TTL_S = 8 * 3600
_CONTEXT = b"levers9 dashboard session v1"
NONCE_BYTES = 12


def _key(secret: str, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_CONTEXT, info=info).derive(
        secret.encode()
    )


@dataclass(frozen=True)
class Session:
    token: str
    expires_at: float
    cookie: str
    """The cookie's value, what the session's CSRF token is bound to."""


class Sessions:
    def __init__(self, secret: str, ttl_s: float = SESSION_TTL_S) -> None:
        self._aead = AESGCM(_key(secret, b"session key"))
        self._csrf_key = _key(secret, b"csrf key")
        self.ttl_s = ttl_s

    def seal(self, token: str, now: float | None = None) -> Session:
        expires_at = (time.time() if now is None else now) + self.ttl_s
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps({"t": token, "e": expires_at}).encode()
        sealed = nonce + self._aead.encrypt(nonce, plain, _CONTEXT)
        cookie = base64.urlsafe_b64encode(sealed).decode().rstrip("=")
        return Session(token, expires_at, cookie)

    def open(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session the cookie seals; None when there is none, it was not sealed here (or
        was altered), or it has expired."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            raw = base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4))
            plain = self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _CONTEXT)
            held = json.loads(plain)
            token, expires_at = str(held["t"]), float(held["e"])
        except (InvalidTag, ValueError, KeyError, TypeError):
            return None
        if expires_at <= (time.time() if now is None else now):
            return None
        return Session(token, expires_at, cookie)

    def csrf(self, bound_to: str) -> str:
        """The CSRF token of a form of the session (or pre-session) cookie `bound_to`."""
        mac = hmac.new(self._csrf_key, bound_to.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode()

    def csrf_matches(self, bound_to: str | None, given: str | None) -> bool:
        if not bound_to or not given:
            return False
        return hmac.compare_digest(self.csrf(bound_to), given)


def random_cookie() -> str:
    return base64.urlsafe_b64encode(os.urandom(18)).decode()
