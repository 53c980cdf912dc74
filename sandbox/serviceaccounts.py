"""Kubernetes service accounts: the accounts, the tokens the API signs for them, and the pod
side (admission, the kubelet's mounted token), as kube-apiserver and kube-controller-manager do.

Accounts. Every namespace gets a `default` ServiceAccount when it is created, and gets it back
if it is deleted while the namespace is active (the service-account controller). Once the API
signs tokens (`enable_tokens`, done by `server.start_sandbox`) every namespace also holds the
`kube-root-ca.crt` ConfigMap (`ca.crt`: the API's CA), kept as the root-CA publisher keeps it.

Admission (the ServiceAccount admission plugin, on pod create). A pod runs as
`spec.serviceAccountName` (default `default`); if that account does not exist the create is
refused, as Kubernetes refuses it:

    403 pods "agent-7d9c" is forbidden: error looking up service account levers9/agent:
        serviceaccount "agent" not found

(a controller's pod names its generateName, `agent-7d9c-`; the ReplicaSet and Job controllers
record it as a `FailedCreate` event and retry). When tokens are enabled and neither the pod nor
its account sets `automountServiceAccountToken: false`, the pod gets the projected volume
Kubernetes gives it, `kube-api-access-<5 chars>` (a `serviceAccountToken` of 3607 s at `token`,
`ca.crt` from `kube-root-ca.crt`, the downward API's `namespace`), mounted read-only at
`/var/run/secrets/kubernetes.io/serviceaccount` in every container that has no mount there.
The kubelet (`cluster.podenv`) writes those files and names the directory in
`LEVERS9_SANDBOX_MOUNTS`, so a pod process finds its token at
`mounts["/var/run/secrets/kubernetes.io/serviceaccount"] + "/token"`.

Tokens. RS256 JWTs signed with a key the sandbox holds (`TokenSigner`; `serve` keeps it in
its state directory), with the claims of Kubernetes' bound tokens:

    {"aud": ["https://kubernetes.default.svc.cluster.local"], "exp": ..., "iat": ..., "nbf": ...,
     "iss": "https://kubernetes.default.svc.cluster.local", "jti": "<uuid>",
     "sub": "system:serviceaccount:<ns>:<name>",
     "kubernetes.io": {"namespace": "<ns>", "serviceaccount": {"name": ..., "uid": ...},
                       "pod": {"name": ..., "uid": ...}, "node": {"name": ..., "uid": ...},
                       "warnafter": ...}}

`POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token` (TokenRequest; `kubectl create
token NAME -n NS`) issues one: `spec.expirationSeconds` defaults to 3600 and may not be under
600, `spec.audiences` default to the API's own, `spec.boundObjectRef` may bind it to a Pod or a
Secret of the namespace. A pod-bound request of exactly 3607 s (what the kubelet asks for) is
valid for a year, with `warnafter` at 3607 s, as the API's extended expiration does.

The API authenticates a token (`authenticate`) while its signature, issuer, audience and time
(60 s leeway) are valid and the account (and the pod or secret it is bound to) still exists
with the uid it names (an object deleted more than 60 s ago counts as gone); otherwise 401. The
caller is `system:serviceaccount:<ns>:<name>` in the groups `system:serviceaccounts`,
`system:serviceaccounts:<ns>` and `system:authenticated`, authorized by RBAC (`rbac`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sandbox import errors
from sandbox.auth import Principal
from sandbox.resources import CONFIG_MAPS, NAMESPACES, NODES, PODS, SECRETS, SERVICE_ACCOUNTS
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

DEFAULT_ACCOUNT = "default"
ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_VOLUME_PREFIX = "kube-api-access-"
DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
USERNAME_PREFIX = "system:serviceaccount:"
ALL_ACCOUNTS_GROUP = "system:serviceaccounts"
AUTHENTICATED_GROUP = "system:authenticated"
KUBELET_TOKEN_SECONDS = 3607  # what admission's projected volume asks for
EXTENDED_TOKEN_SECONDS = 365 * 24 * 3600
DEFAULT_TOKEN_SECONDS = 3600
MIN_TOKEN_SECONDS = 600
MAX_TOKEN_SECONDS = 1 << 32
LEEWAY = dt.timedelta(seconds=60)
_TOKEN_REQUEST_API = "authentication.k8s.io/v1"
_ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters."
)


def username(namespace: str, name: str) -> str:
    """`system:serviceaccount:<namespace>:<name>`, the user a service account's token is."""
    return f"{USERNAME_PREFIX}{namespace}:{name}"


def account_groups(namespace: str) -> tuple[str, ...]:
    return (ALL_ACCOUNTS_GROUP, f"{ALL_ACCOUNTS_GROUP}:{namespace}", AUTHENTICATED_GROUP)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """The service-account signing key (RS256), the issuer and the API's audiences.

    `key_pem` is a PKCS#8 RSA private key; a new one is minted when None (`key_pem` then
    returns it, for keeping)."""

    def __init__(
        self,
        key_pem: bytes | None = None,
        *,
        issuer: str = DEFAULT_ISSUER,
        audiences: Sequence[str] | None = None,
    ) -> None:
        if key_pem is None:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            key_pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        loaded = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(loaded, rsa.RSAPrivateKey):
            raise ValueError("the service-account signing key must be an RSA key")
        self._key = loaded
        self._public = loaded.public_key()
        self.key_pem = key_pem
        self.issuer = issuer
        self.audiences = tuple(audiences or (issuer,))
        der = self._public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = _b64(hashlib.sha256(der).digest())  # as kube-apiserver derives its kid

    def sign(self, claims: dict[str, Any]) -> str:
        header = {"alg": "RS256", "kid": self.key_id}
        signing_input = ".".join(
            _b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"

    def verify(self, token: str, now: dt.datetime) -> dict[str, Any] | None:
        """The claims of a token this key signed for one of the API's audiences and valid at
        `now`; None for anything else."""
        try:
            header_b64, claims_b64, signature_b64 = token.split(".")
            header = json.loads(_unb64(header_b64))
            claims = json.loads(_unb64(claims_b64))
            signature = _unb64(signature_b64)
        except (ValueError, binascii.Error):
            return None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return None
        if header.get("alg") != "RS256" or header.get("kid") not in (None, self.key_id):
            return None
        try:
            self._public.verify(
                signature,
                f"{header_b64}.{claims_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except InvalidSignature:
            return None
        if claims.get("iss") != self.issuer:
            return None
        audiences = claims.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences
        if not isinstance(audiences, list) or not set(audiences) & set(self.audiences):
            return None
        try:
            expires = dt.datetime.fromtimestamp(int(claims["exp"]), dt.UTC)
            not_before = dt.datetime.fromtimestamp(int(claims.get("nbf", 0)), dt.UTC)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        if now > expires + LEEWAY or now < not_before - LEEWAY:
            return None
        return claims


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expiration: dt.datetime
    """When the token is said to expire (`status.expirationTimestamp`)."""


class ServiceAccounts:
    """The registry's service accounts (see module doc): installed by the registry, tokens
    enabled by the API server."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.signer: TokenSigner | None = None
        self._ca_pem: str | None = None

    def install(self) -> None:
        self._registry.store.add_listener(self._on_event)

    def enable_tokens(self, signer: TokenSigner, ca_pem: bytes) -> None:
        """Signs tokens with `signer` from now on, mounts them into new pods, and publishes
        `ca_pem` as `kube-root-ca.crt` in every namespace."""
        self.signer = signer
        self._ca_pem = ca_pem.decode()
        for namespace in self._registry.list(NAMESPACES).items():
            self._ensure_root_ca(namespace["metadata"]["name"])

    def _now(self) -> dt.datetime:
        return self._registry.store.now()

    # -- the controllers ---------------------------------------------------------------------

    def _on_event(self, event: StoredEvent) -> None:
        if event.resource is NAMESPACES and event.type == "ADDED":
            self._ensure_account(event.name)
            self._ensure_root_ca(event.name)
        elif event.resource is SERVICE_ACCOUNTS and event.name == DEFAULT_ACCOUNT:
            if event.type == "DELETED":
                self._ensure_account(event.namespace)
        elif (
            event.resource is CONFIG_MAPS
            and event.name == ROOT_CA_CONFIG_MAP
            and (
                event.type == "DELETED"
                or (
                    event.type == "MODIFIED"
                    and (event.object().get("data") or {}).get("ca.crt") != self._ca_pem
                )
            )
        ):
            self._ensure_root_ca(event.namespace)

    def _ensure_account(self, namespace: str) -> None:
        if self._registry.store.exists(SERVICE_ACCOUNTS, namespace, DEFAULT_ACCOUNT):
            return
        self._create_quietly(SERVICE_ACCOUNTS, namespace, {"metadata": {"name": DEFAULT_ACCOUNT}})

    def _ensure_root_ca(self, namespace: str) -> None:
        if self._ca_pem is None:
            return
        data = {"ca.crt": self._ca_pem}
        store = self._registry.store
        if store.exists(CONFIG_MAPS, namespace, ROOT_CA_CONFIG_MAP):
            current = store.get(CONFIG_MAPS, namespace, ROOT_CA_CONFIG_MAP)
            if current.get("data") != data:
                current["data"] = data
                current.pop("binaryData", None)
                self._registry.replace(CONFIG_MAPS, current)
            return
        self._create_quietly(
            CONFIG_MAPS,
            namespace,
            {
                "metadata": {
                    "name": ROOT_CA_CONFIG_MAP,
                    "annotations": {"kubernetes.io/description": _ROOT_CA_DESCRIPTION},
                },
                "data": data,
            },
        )

    def _create_quietly(self, resource: Any, namespace: str, obj: dict[str, Any]) -> None:
        try:
            self._registry.create(resource, obj, namespace=namespace)
        except errors.ApiError as error:
            # Gone (404), terminating (403) or made meanwhile (409): nothing to do.
            if error.code not in (403, 404, 409):
                raise

    # -- admission ---------------------------------------------------------------------------

    def admit_pod(self, pod: dict[str, Any], namespace: str, display_name: str) -> None:
        """The ServiceAccount admission plugin on a pod create: 403 without the account, the
        token volume when tokens are on and automount is not turned off."""
        spec = pod.setdefault("spec", {})
        name = str(spec.get("serviceAccountName") or DEFAULT_ACCOUNT)
        spec["serviceAccountName"] = name
        try:
            account = self._registry.get(SERVICE_ACCOUNTS, namespace, name)
        except errors.ApiError as error:
            if error.code != 404:
                raise
            raise errors.forbidden(
                PODS,
                display_name,
                f"error looking up service account {namespace}/{name}: "
                f'serviceaccount "{name}" not found',
            ) from None
        if self.signer is None:
            return
        automount = spec.get("automountServiceAccountToken")
        if automount is None:
            automount = account.get("automountServiceAccountToken")
        if automount is False:
            return
        self._mount_token(spec)

    def _mount_token(self, spec: dict[str, Any]) -> None:
        volumes = spec.get("volumes") or []
        existing = next(
            (
                str(v.get("name"))
                for v in volumes
                if str(v.get("name", "")).startswith(TOKEN_VOLUME_PREFIX)
            ),
            None,
        )
        volume_name = existing or TOKEN_VOLUME_PREFIX + self._registry.random_suffix()
        needed = False
        for group in ("initContainers", "containers"):
            for container in spec.get(group) or ():
                mounts = container.setdefault("volumeMounts", [])
                if any(m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
                    continue
                mounts.append(
                    {"name": volume_name, "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}
                )
                needed = True
        if needed and existing is None:
            spec["volumes"] = [*volumes, token_volume(volume_name)]

    # -- tokens ------------------------------------------------------------------------------

    def token_request(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """`serviceaccounts/token`: the TokenRequest answered, with `status.token`."""
        signer = self._require_signer()
        if not isinstance(body, dict) or body.get("kind", "TokenRequest") != "TokenRequest":
            raise errors.bad_request("the body of the request is not a TokenRequest")
        account = self._registry.get(SERVICE_ACCOUNTS, namespace, name)
        spec = dict(body.get("spec") or {})
        seconds = spec.get("expirationSeconds")
        seconds = DEFAULT_TOKEN_SECONDS if seconds is None else seconds
        detail = None
        if not isinstance(seconds, int) or isinstance(seconds, bool):
            detail = f"Invalid value: {seconds!r}: must be an integer"
        elif seconds < MIN_TOKEN_SECONDS:
            detail = f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"
        elif seconds > MAX_TOKEN_SECONDS:
            detail = (
                f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
            )
        if detail is not None:
            raise errors.ApiError(
                422,
                "Invalid",
                f'TokenRequest.authentication.k8s.io "{name}" is invalid: '
                f"spec.expirationSeconds: {detail}",
                {
                    "name": name,
                    "group": "authentication.k8s.io",
                    "kind": "TokenRequest",
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": detail,
                            "field": "spec.expirationSeconds",
                        }
                    ],
                },
            )
        audiences = [str(a) for a in spec.get("audiences") or ()] or list(signer.audiences)
        bound = spec.get("boundObjectRef")
        pod = secret = None
        if bound:
            kind = str(bound.get("kind", ""))
            api_version = str(bound.get("apiVersion") or "v1")
            bound_name = str(bound.get("name", ""))
            if api_version == "v1" and kind == "Pod":
                pod = self._registry.get(PODS, namespace, bound_name)
                if (pod.get("spec") or {}).get("serviceAccountName") != name:
                    raise errors.bad_request(
                        f'cannot bind token for serviceaccount "{name}" to pod running with '
                        "different serviceaccount name."
                    )
                found = pod
            elif api_version == "v1" and kind == "Secret":
                secret = self._registry.get(SECRETS, namespace, bound_name)
                found = secret
            else:
                group = api_version.rpartition("/")[0]
                version = api_version.rpartition("/")[2]
                raise errors.bad_request(
                    f"cannot bind token to object of type {group}/{version}, Kind={kind}"
                )
            uid = found["metadata"]["uid"]
            if bound.get("uid") and bound["uid"] != uid:
                raise errors.ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind} "{bound_name}": the UID in the '
                    f"bound object reference ({bound['uid']}) does not match the UID in record. "
                    "The object might have been deleted and then recreated",
                    {"name": bound_name, "kind": kind},
                )
            spec["boundObjectRef"] = {
                "kind": kind,
                "apiVersion": api_version,
                "name": bound_name,
                "uid": uid,
            }
        spec["audiences"] = audiences
        spec["expirationSeconds"] = seconds
        issued = self._issue(account, audiences, seconds, pod=pod, secret=secret)
        return {
            "kind": "TokenRequest",
            "apiVersion": _TOKEN_REQUEST_API,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "creationTimestamp": rfc3339(self._now()),
            },
            "spec": spec,
            "status": {
                "token": issued.token,
                "expirationTimestamp": rfc3339(issued.expiration),
            },
        }

    def issue(
        self,
        namespace: str,
        name: str,
        *,
        audiences: Sequence[str] | None = None,
        expiration_seconds: int = DEFAULT_TOKEN_SECONDS,
    ) -> IssuedToken:
        """A token for the account, bound to nothing else (what `kubectl create token` gets).
        In-process: no minimum lifetime, so a test may mint one that has already expired."""
        signer = self._require_signer()
        account = self._registry.get(SERVICE_ACCOUNTS, namespace, name)
        return self._issue(account, list(audiences or signer.audiences), expiration_seconds)

    def pod_token(
        self, pod: dict[str, Any], *, audience: str | None, expiration_seconds: int
    ) -> str:
        """What the kubelet writes for a pod's `serviceAccountToken` projection: a token of
        the pod's account bound to the pod (raises ApiError as the TokenRequest would)."""
        signer = self._require_signer()
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        name = str((pod.get("spec") or {}).get("serviceAccountName") or DEFAULT_ACCOUNT)
        account = self._registry.get(SERVICE_ACCOUNTS, namespace, name)
        audiences = [audience] if audience else list(signer.audiences)
        current = self._registry.get(PODS, namespace, str(meta.get("name", "")))
        if current["metadata"]["uid"] != meta.get("uid"):
            raise errors.not_found(PODS, str(meta.get("name", "")))
        return self._issue(
            account, audiences, max(expiration_seconds, MIN_TOKEN_SECONDS), pod=current
        ).token

    def _require_signer(self) -> TokenSigner:
        if self.signer is None:
            raise errors.ApiError(
                404,
                "NotFound",
                "this registry signs no service-account tokens (no API server enabled them)",
                {},
            )
        return self.signer

    def _issue(
        self,
        account: dict[str, Any],
        audiences: list[str],
        seconds: int,
        *,
        pod: dict[str, Any] | None = None,
        secret: dict[str, Any] | None = None,
    ) -> IssuedToken:
        signer = self._require_signer()
        meta = account["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        now = self._now()
        issued_at = int(now.timestamp())
        private: dict[str, Any] = {"namespace": namespace}
        lifetime = seconds
        if pod is not None:
            pod_meta = pod["metadata"]
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name and self._registry.store.exists(NODES, None, str(node_name)):
                node = self._registry.get(NODES, None, str(node_name))
                private["node"] = {"name": node_name, "uid": node["metadata"]["uid"]}
            private["pod"] = {"name": pod_meta["name"], "uid": pod_meta["uid"]}
            if seconds == KUBELET_TOKEN_SECONDS and set(audiences) <= set(signer.audiences):
                lifetime = EXTENDED_TOKEN_SECONDS
                private["warnafter"] = issued_at + seconds
        if secret is not None:
            secret_meta = secret["metadata"]
            private["secret"] = {"name": secret_meta["name"], "uid": secret_meta["uid"]}
        private["serviceaccount"] = {"name": name, "uid": meta["uid"]}
        claims = {
            "aud": audiences,
            "exp": issued_at + lifetime,
            "iat": issued_at,
            "iss": signer.issuer,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": private,
            "nbf": issued_at,
            "sub": username(namespace, name),
        }
        expiration = dt.datetime.fromtimestamp(issued_at + seconds, dt.UTC)
        return IssuedToken(signer.sign(claims), expiration)

    # -- authentication ----------------------------------------------------------------------

    def authenticate(self, token: str) -> Principal | None:
        """The service account behind a bearer token, or None (not one of ours, or no longer
        valid: see module doc)."""
        if self.signer is None or token.count(".") != 2:
            return None
        claims = self.signer.verify(token, self._now())
        private = (claims or {}).get("kubernetes.io")
        if claims is None or not isinstance(private, dict):
            return None
        namespace = str(private.get("namespace") or "")
        account = private.get("serviceaccount")
        if not namespace or not isinstance(account, dict):
            return None
        name = str(account.get("name") or "")
        if claims.get("sub") != username(namespace, name):
            return None
        if not self._alive(SERVICE_ACCOUNTS, namespace, account):
            return None
        for key, resource in (("pod", PODS), ("secret", SECRETS)):
            ref = private.get(key)
            if ref is not None and not self._alive(resource, namespace, ref):
                return None
        return Principal(
            username(namespace, name), groups=account_groups(namespace), in_cluster=True
        )

    def _alive(self, resource: Any, namespace: str, ref: Any) -> bool:
        if not isinstance(ref, dict) or not ref.get("name"):
            return False
        try:
            obj = self._registry.get(resource, namespace, str(ref["name"]))
        except errors.ApiError:
            return False
        meta = obj["metadata"]
        if meta.get("uid") != ref.get("uid"):
            return False
        deleted = meta.get("deletionTimestamp")
        if deleted:
            moment = dt.datetime.fromisoformat(str(deleted).replace("Z", "+00:00"))
            if moment < self._now() - LEEWAY:
                return False
        return True


def token_volume(name: str) -> dict[str, Any]:
    """The projected volume admission adds (`kube-api-access-*`)."""
    return {
        "name": name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {
                    "serviceAccountToken": {
                        "expirationSeconds": KUBELET_TOKEN_SECONDS,
                        "path": "token",
                    }
                },
                {
                    "configMap": {
                        "name": ROOT_CA_CONFIG_MAP,
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }
