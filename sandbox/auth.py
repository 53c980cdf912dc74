"""Who is calling: GKE's service-account authentication, static tokens, and the token endpoint.

A service-account key works as on Google Cloud: google-auth signs a JWT with the key's private
key and posts it to the key's `token_uri` (`POST /token`, form `grant_type=urn:ietf:params:
oauth:grant-type:jwt-bearer&assertion=<JWT>`); the emulator verifies the RS256 signature
against the public half of a key it minted and answers with an opaque bearer token
(`{"access_token": "ya29....", "expires_in": 3600, "token_type": "Bearer"}`), which the
Kubernetes API then accepts until it expires. Errors read like Google's OAuth2 endpoint
(`{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}`), which google-auth
raises as `RefreshError`.

GKE names a service-account caller by its email only when the access token carries the
`userinfo.email` scope; with just `cloud-platform` (what the product requests) RBAC and error
messages show the account's numeric unique id. The emulator does the same. IAM roles are
granted to the email either way (`access.AccessPolicy`).

Static bearer tokens (kubeconfig users, `flavor: generic` clusters) are configured at start;
the admin token's user is the person at the laptop, who is not subject to authorized networks.

Kubernetes service-account tokens (the JWTs a pod's kubelet mounts, and `kubectl create
token`'s) are checked by the token authenticators added with `add_token_authenticator`
(`serviceaccounts.ServiceAccounts.authenticate`); their principals are `in_cluster`: RBAC
authorizes them (`rbac`), not IAM, and the authorized networks do not apply to them.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sandbox import pki

JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
EMAIL_SCOPES = frozenset({"https://www.googleapis.com/auth/userinfo.email", "email"})
TOKEN_LIFETIME = dt.timedelta(hours=1)
# google-auth addresses its assertion to Google's endpoint whatever the key's token_uri says.
GOOGLE_TOKEN_AUDIENCES = (
    "https://oauth2.googleapis.com/token",
    "https://accounts.google.com/o/oauth2/token",
)
_CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        username: the name the API uses in messages (`User "..."`).
        email: the Google identity IAM roles are bound to; None for static-token users.
        superuser: static users configured as cluster admins skip IAM checks.
        network_exempt: calls from the operator's workstation (the admin's kubectl), not the
            controlplane's egress: checked against the authorized networks from its own address
            (`AccessPolicy.workstation_ip`), as GKE checks every caller's source.
        groups: the groups RBAC matches Group subjects against (`system:serviceaccounts`,
            `system:serviceaccounts:<ns>`, `system:authenticated` for a service account).
        in_cluster: a Kubernetes service account (`system:serviceaccount:<ns>:<name>`): RBAC
            decides what it may do, and it calls from inside the cluster, so the master
            authorized networks do not apply to it. (A user the admin impersonates, `kubectl
            --as`, is one too, once the caller's own network check has passed.)
    """

    username: str
    email: str | None = None
    superuser: bool = False
    network_exempt: bool = False
    groups: tuple[str, ...] = ()
    in_cluster: bool = False


class TokenError(Exception):
    """A refused token exchange, rendered as Google's OAuth2 error body (HTTP 400)."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error = error
        self.description = description

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description}


@dataclass(frozen=True)
class _Key:
    key_id: str
    email: str
    unique_id: str
    public_key: rsa.RSAPublicKey


@dataclass(frozen=True)
class _Issued:
    principal: Principal
    expires: dt.datetime
    key_id: str


def _b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


class Authenticator:
    """Service-account keys, the tokens exchanged for them, and static tokens."""

    def __init__(
        self,
        token_uri: str,
        *,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.token_uri = token_uri
        self._now = now
        self._keys: dict[str, _Key] = {}
        self._issued: dict[str, _Issued] = {}
        self._static: dict[str, Principal] = {}
        self._token_authenticators: list[Callable[[str], Principal | None]] = []
        self._exchanges = 0

    # -- configuration -----------------------------------------------------------------------

    def add_static_token(
        self, token: str, username: str, *, superuser: bool = True, network_exempt: bool = False
    ) -> None:
        self._static[token] = Principal(username, None, superuser, network_exempt)

    def add_token_authenticator(self, authenticate: Callable[[str], Principal | None]) -> None:
        """Asks `authenticate(token)` about bearer tokens that are neither static nor issued
        here (service-account JWTs); None from it means not its token."""
        self._token_authenticators.append(authenticate)

    def register_key(self, key: dict[str, str]) -> None:
        """Trusts a service-account key (the JSON gcloud writes): its public half verifies
        the JWTs google-auth signs with it."""
        private = serialization.load_pem_private_key(key["private_key"].encode(), password=None)
        if not isinstance(private, rsa.RSAPrivateKey):
            raise ValueError("service-account keys are RSA keys")
        self._keys[key["private_key_id"]] = _Key(
            key["private_key_id"], key["client_email"], key["client_id"], private.public_key()
        )

    def mint_key(self, *, project: str, account: str) -> dict[str, str]:
        """A new key for `account@project.iam.gserviceaccount.com`, trusted by this server."""
        key = pki.mint_service_account_key(
            project=project, account=account, token_uri=self.token_uri
        )
        self.register_key(key)
        return key

    def revoke_key(self, key_id: str, *, revoke_tokens: bool = False) -> None:
        """Deletes a key, as `gcloud iam service-accounts keys delete` does; issued tokens
        stay valid until they expire, as on Google Cloud, unless `revoke_tokens` (Google
        revoking them too, as after a disabled account): then they are 401 at once."""
        self._keys.pop(key_id, None)
        if revoke_tokens:
            for token in [t for t, issued in self._issued.items() if issued.key_id == key_id]:
                del self._issued[token]

    # -- the token endpoint ------------------------------------------------------------------

    def exchange(self, form: dict[str, str]) -> dict[str, Any]:
        """Answers a token request; raises TokenError for anything Google would refuse."""
        grant = form.get("grant_type", "")
        if grant != JWT_BEARER_GRANT:
            raise TokenError("unsupported_grant_type", f"Invalid grant_type: {grant}")
        claims, key = self._verify(form.get("assertion", ""))
        scopes = frozenset(str(claims.get("scope", "")).split())
        username = key.email if scopes & EMAIL_SCOPES else key.unique_id
        token = "ya29." + secrets.token_urlsafe(48)
        self._issued[token] = _Issued(
            Principal(username, key.email), self._now() + TOKEN_LIFETIME, key.key_id
        )
        self._exchanges += 1
        self._expire_old()
        return {
            "access_token": token,
            "expires_in": int(TOKEN_LIFETIME.total_seconds()),
            "token_type": "Bearer",
        }

    def _verify(self, assertion: str) -> tuple[dict[str, Any], _Key]:
        try:
            header_b64, payload_b64, signature_b64 = assertion.split(".")
            header = json.loads(_b64url(header_b64))
            claims = json.loads(_b64url(payload_b64))
            signature = _b64url(signature_b64)
        except (ValueError, binascii.Error):
            raise TokenError("invalid_grant", "Invalid JWT: malformed assertion.") from None
        if header.get("alg") != "RS256":
            raise TokenError("invalid_grant", "Invalid JWT: unsupported signature algorithm.")
        key = self._keys.get(str(header.get("kid", "")))
        if key is None or claims.get("iss") != key.email:
            raise TokenError("invalid_grant", "Invalid grant: account not found")
        try:
            key.public_key.verify(
                signature,
                f"{header_b64}.{payload_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except InvalidSignature:
            raise TokenError("invalid_grant", "Invalid JWT Signature.") from None
        if claims.get("aud") not in (self.token_uri, *GOOGLE_TOKEN_AUDIENCES):
            raise TokenError("invalid_grant", "Invalid JWT: audience does not match.")
        now = self._now()
        try:
            issued = dt.datetime.fromtimestamp(int(claims["iat"]), dt.UTC)
            expires = dt.datetime.fromtimestamp(int(claims["exp"]), dt.UTC)
        except (KeyError, TypeError, ValueError):
            issued = expires = now - 2 * TOKEN_LIFETIME
        if (
            issued > now + _CLOCK_SKEW
            or expires < now - _CLOCK_SKEW
            or expires - issued > TOKEN_LIFETIME
        ):
            raise TokenError(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
                "timeframe. Check your iat and exp values in the JWT claim.",
            )
        return claims, key

    def expire_tokens(self) -> int:
        """Every issued access token expires now (the API answers them 401 until the client
        exchanges its key again); how many were still valid."""
        now = self._now()
        valid = sum(1 for issued in self._issued.values() if issued.expires >= now)
        self._issued.clear()
        return valid

    @property
    def exchanges(self) -> int:
        """How many access tokens `/token` has issued since start."""
        return self._exchanges

    def _expire_old(self) -> None:
        now = self._now()
        for token in [t for t, issued in self._issued.items() if issued.expires < now]:
            del self._issued[token]

    # -- the API -----------------------------------------------------------------------------

    @staticmethod
    def presents_token(authorization: str | None) -> bool:
        """Whether the header carries a bearer token at all. One that does and is not valid is
        401 on every path, public ones too (the apiserver does not take a bad token for an
        anonymous caller); a request without one is anonymous."""
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and bool(token.strip())

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller behind an `Authorization` header, or None (401)."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        token = token.strip()
        static = self._static.get(token)
        if static is not None:
            return static
        issued = self._issued.get(token)
        if issued is not None:
            return issued.principal if issued.expires >= self._now() else None
        for authenticate in self._token_authenticators:
            principal = authenticate(token)
            if principal is not None:
                return principal
        return None
