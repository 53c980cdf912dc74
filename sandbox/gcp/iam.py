"""IAM's service accounts and their keys (`iam.googleapis.com/v1`), and the self-signed JWTs
those keys sign.

A key created here is real: its private half is minted by `pki`, registered with the
sandbox's `Authenticator` (so the Kubernetes API and both `/token` endpoints trust it) and
handed to the vault that keeps it across restarts; only the public facts stay in the world.
What the account may do is the project's IAM policy (`policy.ProjectPolicy`).

Google's client libraries do not exchange a service-account key for an access token before
calling a Cloud API: they sign a JWT with the key (`iss` = `sub` = the account, `aud` = the
API's root URL or a `scope` claim, an hour at most) and send it as the bearer token. The
emulator verifies those against the public keys of the keys it knows, so
`GOOGLE_APPLICATION_CREDENTIALS` works with every client; keys known here are those created
through this API and those the sandbox adopted at start (`adopt_key`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sandbox import pki
from sandbox.access import AccessPolicy
from sandbox.auth import Authenticator, Principal
from sandbox.gcp import errors
from sandbox.gcp.calls import Call, Json, Route, rfc3339
from sandbox.gcp.world import SERVICE_ACCOUNT_DOMAIN, GcpWorld, KeyInfo, ServiceAccount

SERVICE = "iam.googleapis.com"
MAX_KEYS_PER_ACCOUNT = 10
_JWT_LIFETIME = dt.timedelta(hours=1)
_CLOCK_SKEW = dt.timedelta(minutes=5)
_ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
_NO_EXPIRY = "9999-12-31T23:59:59Z"
# The PKCS12 key file type, by name and by the number a client sending numeric enums uses.
_P12 = ("TYPE_PKCS12_FILE", 1)


class KeyVault(Protocol):
    """Where the sandbox keeps the keys it trusts across restarts (`serve.SandboxState`)."""

    def save_key(self, key: dict[str, str], roles: Sequence[str]) -> None: ...

    def forget_key(self, key_id: str) -> None: ...


def _b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def split_email(email: str) -> tuple[str, str] | None:
    """(account id, project) of a user-managed service account's email, else None."""
    local, _, domain = email.partition("@")
    project, _, rest = domain.partition(".")
    if not local or rest != SERVICE_ACCOUNT_DOMAIN:
        return None
    return local, project


class Iam:
    """Service accounts, user-managed keys, and verification of the JWTs keys sign."""

    def __init__(
        self,
        world: GcpWorld,
        authenticator: Authenticator,
        access: AccessPolicy,
        token_uri: str,
        vault: KeyVault | None,
        persist: Callable[[], None],
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._world = world
        self._authenticator = authenticator
        self._access = access
        self._token_uri = token_uri
        self._vault = vault
        self._persist = persist
        self._now = now
        self._public: dict[str, tuple[str, rsa.RSAPublicKey]] = {}

    # -- the sandbox's side ------------------------------------------------------------------

    def ensure_account(self, project: str, account_id: str, display_name: str = "") -> Json:
        """The account, created when missing (what `create` does, without the 409)."""
        email = f"{account_id}@{project}.{SERVICE_ACCOUNT_DOMAIN}"
        account = self._world.service_accounts.get(email)
        if account is None:
            account = ServiceAccount(project, account_id, self._unique_id(), display_name)
            self._world.service_accounts[email] = account
            self._persist()
        return self._account_json(account)

    def adopt_key(self, key: dict[str, str]) -> None:
        """Knows a key minted elsewhere in the sandbox (its account appears if missing)."""
        private = serialization.load_pem_private_key(key["private_key"].encode(), password=None)
        if not isinstance(private, rsa.RSAPrivateKey):
            raise ValueError("service-account keys are RSA keys")
        email = key["client_email"]
        self._public[key["private_key_id"]] = (email, private.public_key())
        parts = split_email(email)
        if parts is not None and email not in self._world.service_accounts:
            account_id, project = parts
            self._world.service_accounts[email] = ServiceAccount(
                project, account_id, key.get("client_id") or self._unique_id()
            )
        if key["private_key_id"] not in self._world.keys:
            self._world.keys[key["private_key_id"]] = KeyInfo(
                key["private_key_id"], email, rfc3339(self._now())
            )

    def mint_key(self, email: str, roles: Sequence[str] = ()) -> dict[str, str]:
        """A new key for an existing account, trusted by the sandbox and kept by the vault;
        `roles` are saved with it (granted again on restart), as the sandbox's own keys are."""
        account = self._world.service_accounts[email]
        key = pki.mint_service_account_key(
            project=account.project, account=account.account_id, token_uri=self._token_uri
        )
        key["client_id"] = account.unique_id
        self._authenticator.register_key(key)
        self.adopt_key(key)
        if self._vault is not None:
            self._vault.save_key(key, roles)
        self._persist()
        return key

    def verify_jwt(self, token: str) -> Principal | None:
        """The account behind a self-signed JWT bearer token, or None."""
        try:
            header_b64, claims_b64, signature_b64 = token.split(".")
            header = json.loads(_b64url(header_b64))
            claims: dict[str, Any] = json.loads(_b64url(claims_b64))
            signature = _b64url(signature_b64)
        except (ValueError, binascii.Error):
            return None
        known = self._public.get(str(header.get("kid", "")))
        if header.get("alg") != "RS256" or known is None:
            return None
        email, public = known
        if claims.get("iss") != email or not (claims.get("aud") or claims.get("scope")):
            return None
        try:
            signed = f"{header_b64}.{claims_b64}".encode()
            public.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
            issued = dt.datetime.fromtimestamp(int(claims["iat"]), dt.UTC)
            expires = dt.datetime.fromtimestamp(int(claims["exp"]), dt.UTC)
        except (InvalidSignature, KeyError, TypeError, ValueError):
            return None
        now = self._now()
        if issued > now + _CLOCK_SKEW or expires < now or expires - issued > _JWT_LIFETIME:
            return None
        return Principal(email, email)

    # -- the API -----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        accounts = "/v1/projects/{project}/serviceAccounts"
        account = accounts + "/{account}"

        def route(method: str, path: str, permission: str, handler: Any) -> Route:
            return Route(method, path, permission, handler, SERVICE)

        return [
            route("GET", accounts, "iam.serviceAccounts.list", self._list),
            route("POST", accounts, "iam.serviceAccounts.create", self._create),
            route("GET", account, "iam.serviceAccounts.get", self._get),
            route("DELETE", account, "iam.serviceAccounts.delete", self._delete),
            route("GET", account + "/keys", "iam.serviceAccountKeys.list", self._list_keys),
            route("POST", account + "/keys", "iam.serviceAccountKeys.create", self._create_key),
            route("GET", account + "/keys/{key}", "iam.serviceAccountKeys.get", self._get_key),
            route(
                "DELETE", account + "/keys/{key}", "iam.serviceAccountKeys.delete", self._delete_key
            ),
        ]

    def _list(self, call: Call) -> Json:
        project = call.params["project"]
        found = [a for a in self._world.service_accounts.values() if a.project == project]
        return {"accounts": [self._account_json(a) for a in sorted(found, key=lambda a: a.email)]}

    def _create(self, call: Call) -> Json:
        project = call.params["project"]
        account_id = str(call.body.get("accountId", ""))
        if not 6 <= len(account_id) <= 30 or not _ACCOUNT_ID.match(account_id):
            raise errors.invalid_argument(
                f"Invalid account ID {account_id!r}: it must be 6 to 30 lowercase letters, "
                "digits or hyphens, start with a letter and not end with a hyphen."
            )
        email = f"{account_id}@{project}.{SERVICE_ACCOUNT_DOMAIN}"
        if email in self._world.service_accounts:
            raise errors.GoogleApiError(
                409,
                f"Service account {account_id} already exists within project projects/{project}.",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                        "resourceName": f"projects/{project}/serviceAccounts/{email}",
                    }
                ],
            )
        spec = call.body.get("serviceAccount") or {}
        account = ServiceAccount(
            project,
            account_id,
            self._unique_id(),
            str(spec.get("displayName", "")),
            str(spec.get("description", "")),
        )
        self._world.service_accounts[email] = account
        self._persist()
        return self._account_json(account)

    def _get(self, call: Call) -> Json:
        return self._account_json(self._account(call))

    def _delete(self, call: Call) -> Json:
        account = self._account(call)
        for info in [k for k in self._world.keys.values() if k.email == account.email]:
            self._forget(info.key_id)
        del self._world.service_accounts[account.email]
        self._access.revoke(account.email)
        self._world.api_roles[account.email] = []
        self._persist()
        return {}

    def _create_key(self, call: Call) -> Json:
        account = self._account(call)
        if call.body.get("privateKeyType") in _P12:
            raise errors.invalid_argument("P12 keys are not supported here; use JSON key files.")
        owned = [k for k in self._world.keys.values() if k.email == account.email]
        if len(owned) >= MAX_KEYS_PER_ACCOUNT:
            raise errors.GoogleApiError(
                400, "Precondition check failed.", status="FAILED_PRECONDITION"
            )
        key = self.mint_key(account.email)
        answer = self._key_json(account, self._world.keys[key["private_key_id"]])
        answer["privateKeyType"] = "TYPE_GOOGLE_CREDENTIALS_FILE"
        key_file = pki.service_account_key_json(key).encode()
        answer["privateKeyData"] = base64.b64encode(key_file).decode()
        return answer

    def _list_keys(self, call: Call) -> Json:
        account = self._account(call)
        wanted = call.query.get("keyTypes", "USER_MANAGED")
        if wanted not in ("USER_MANAGED", "KEY_TYPE_UNSPECIFIED", "1", "0"):
            return {"keys": []}
        owned = sorted(
            (k for k in self._world.keys.values() if k.email == account.email),
            key=lambda k: k.valid_after,
        )
        return {"keys": [self._key_json(account, k) for k in owned]}

    def _get_key(self, call: Call) -> Json:
        account = self._account(call)
        return self._key_json(account, self._key(call, account))

    def _delete_key(self, call: Call) -> Json:
        account = self._account(call)
        self._forget(self._key(call, account).key_id)
        self._persist()
        return {}

    # -- helpers -----------------------------------------------------------------------------

    def _account(self, call: Call) -> ServiceAccount:
        wanted = call.params["account"]
        for account in self._world.service_accounts.values():
            if wanted in (account.email, account.unique_id):
                return account
        raise errors.not_found(f"Unknown service account: {wanted}")

    def _key(self, call: Call, account: ServiceAccount) -> KeyInfo:
        info = self._world.keys.get(call.params["key"])
        if info is None or info.email != account.email:
            raise errors.not_found(f"Unknown key: {call.params['key']}")
        return info

    def _forget(self, key_id: str) -> None:
        self._world.keys.pop(key_id, None)
        self._public.pop(key_id, None)
        self._authenticator.revoke_key(key_id)
        if self._vault is not None:
            self._vault.forget_key(key_id)

    def _unique_id(self) -> str:
        return self._world.new_id(21)

    @staticmethod
    def _account_json(account: ServiceAccount) -> Json:
        body: Json = {
            "name": account.name,
            "projectId": account.project,
            "uniqueId": account.unique_id,
            "email": account.email,
            "etag": base64.b64encode(b"\x00\x01\x02\x03").decode(),
            "oauth2ClientId": account.unique_id,
        }
        if account.display_name:
            body["displayName"] = account.display_name
        if account.description:
            body["description"] = account.description
        return body

    @staticmethod
    def _key_json(account: ServiceAccount, info: KeyInfo) -> Json:
        return {
            "name": info.name(account.project),
            "validAfterTime": info.valid_after,
            "validBeforeTime": _NO_EXPIRY,
            "keyAlgorithm": "KEY_ALG_RSA_2048",
            "keyOrigin": "GOOGLE_PROVIDED",
            "keyType": "USER_MANAGED",
        }
