"""Authentication and authorization as GKE does them: google-auth's service-account flow against
the emulator's token endpoint, 401 for unknown, expired or revoked tokens (from an allowed
network), IAM-role 403s with GKE's wording, and the master-authorized-networks check on the
controlplane's egress IP (403 or a dropped connection), from which the admin user is exempt;
and the product's client exchanging its key again after a 401."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google.auth.transport.urllib3
import pytest
import urllib3
from google.auth.exceptions import RefreshError
from google.oauth2 import service_account
from kubernetes import client

from activities.kube_clients import KubeClients
from levers9.config import parse_pool
from levers9.devstack import values as devvalues
from sandbox import pki
from sandbox.access import DEVELOPER
from sandbox.server import Sandbox
from tests.sandbox.factories import Api, api_client, jwt_assertion, status_of, unique

Call = Callable[..., Any]
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
EMAIL = "https://www.googleapis.com/auth/userinfo.email"


UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


@pytest.fixture
def mint_key(sandbox: Sandbox, sandbox_call: Call) -> Callable[..., dict[str, str]]:
    def mint(*roles: str) -> dict[str, str]:
        key: dict[str, str] = sandbox_call(
            sandbox.mint_service_account_key, project="demo", account=unique("sa"), roles=roles
        )
        return key

    return mint


@pytest.fixture
def token_for(ca_file: Path) -> Callable[..., str]:
    """Exchanges a key for an access token exactly as the product will: google-auth."""
    pool = urllib3.PoolManager(ca_certs=str(ca_file))
    transport = google.auth.transport.urllib3.Request(pool)  # type: ignore[no-untyped-call]

    def exchange(key: dict[str, str], *scopes: str) -> str:
        credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            key, scopes=list(scopes) or [CLOUD_PLATFORM]
        )
        credentials.refresh(transport)
        token: str = credentials.token
        return token

    return exchange


@pytest.fixture
def developer_token(mint_key: Callable[..., dict[str, str]], token_for: Callable[..., str]) -> str:
    """An access token of a new account with the developer role."""
    return token_for(mint_key(DEVELOPER))


@pytest.fixture
def core_as(sandbox: Sandbox, ca_file: Path) -> Callable[[str], Api]:
    return lambda token: client.CoreV1Api(api_client(sandbox.url, ca_file, token))


def forbidden_body(error: client.ApiException) -> dict[str, Any]:
    assert error.status == 403
    body = status_of(error)
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Forbidden", 403)
    return body


def test_service_account_key_end_to_end(
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
    namespace: str,
) -> None:
    key = mint_key(DEVELOPER)
    token = token_for(key)
    assert token.startswith("ya29.")
    pods = core_as(token).list_namespaced_pod(namespace)
    assert pods.items == []


def test_token_endpoint_refuses_keys_it_did_not_mint(
    sandbox: Sandbox, token_for: Callable[..., str]
) -> None:
    stranger = pki.mint_service_account_key(
        project="demo", account="stranger", token_uri=sandbox.token_uri
    )
    with pytest.raises(RefreshError, match="invalid_grant"):
        token_for(stranger)


def test_revoked_key_cannot_get_tokens(
    sandbox: Sandbox,
    sandbox_call: Call,
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
) -> None:
    key = mint_key(DEVELOPER)
    sandbox_call(sandbox.parts.authenticator.revoke_key, key["private_key_id"])
    with pytest.raises(RefreshError, match="account not found"):
        token_for(key)


def test_unknown_bearer_token_is_unauthorized(core_as: Callable[[str], Api]) -> None:
    with pytest.raises(client.ApiException) as caught:
        core_as("not-a-token").list_namespace()
    assert caught.value.status == 401
    assert status_of(caught.value) == UNAUTHORIZED


def _authenticated(call: Callable[[], Any]) -> None:
    """The call's token is one the API knows: it answers, or refuses with 403 (authorization)."""
    try:
        call()
    except client.ApiException as error:
        if error.status != 403:
            raise


@pytest.fixture
def bad_token(
    request: pytest.FixtureRequest,
    sandbox: Sandbox,
    sandbox_call: Call,
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core: Api,
    core_as: Callable[[str], Api],
    namespace: str,
) -> str:
    """A bearer token of the kind `request.param` names; one that was valid was used first."""
    kind: str = request.param
    if kind == "unknown":
        return "ya29.never-issued-here"
    if kind == "garbled-jwt":
        return "eyJhbGciOiJSUzI1NiJ9.not-json.c2ln"
    if kind == "foreign-signature":  # a JWT signed with a key the API never trusted
        return jwt_assertion(mint_key(DEVELOPER), sandbox.url)
    if kind in ("expired-access-token", "revoked-key"):
        key = mint_key(DEVELOPER)
        token = token_for(key)
        _authenticated(lambda: core_as(token).list_namespaced_pod(namespace))
        if kind == "revoked-key":
            revoke = sandbox.parts.authenticator.revoke_key
            sandbox_call(revoke, key["private_key_id"], revoke_tokens=True)
        else:
            sandbox_call(sandbox.expire_tokens)
        return token
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    if kind == "expired-service-account-token":
        expired: str = sandbox_call(
            sandbox.service_account_token, namespace, "agent", expiration_seconds=-120
        )
        return expired
    assert kind == "deleted-service-account"
    account_token: str = sandbox_call(sandbox.service_account_token, namespace, "agent")
    _authenticated(lambda: core_as(account_token).list_namespaced_pod(namespace))
    core.delete_namespaced_service_account("agent", namespace)
    return account_token


@pytest.mark.parametrize(
    "bad_token",
    [
        "unknown",
        "garbled-jwt",
        "foreign-signature",
        "expired-access-token",
        "revoked-key",
        "expired-service-account-token",
        "deleted-service-account",
    ],
    indirect=True,
)
def test_every_bad_token_is_401_for_the_client_its_watches_kubectl_and_public_paths(
    bad_token: str,
    core_as: Callable[[str], Api],
    kubectl: Callable[..., str],
    http: Callable[..., urllib3.BaseHTTPResponse],
    namespace: str,
    tmp_path: Path,
) -> None:
    api = core_as(bad_token)
    calls: list[Callable[[], Any]] = [
        lambda: api.list_namespaced_pod(namespace),
        lambda: api.list_namespaced_pod(
            namespace, watch=True, timeout_seconds=1, _preload_content=False
        ),
        lambda: api.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}}),
    ]
    for call in calls:
        with pytest.raises(client.ApiException) as caught:
            call()
        assert caught.value.status == 401
        assert status_of(caught.value) == UNAUTHORIZED
    # Paths an anonymous caller may read are 401 too: a bad token is not taken for no token.
    for path in ("/version", "/healthz"):
        assert http("GET", path, anonymous=True).status == 200
        answer = http("GET", path, token=bad_token)
        assert (answer.status, json.loads(answer.data)) == (401, UNAUTHORIZED)
    # With a fresh discovery cache kubectl's first call, discovery, is the one refused; with
    # discovery cached (by the admin's call), the list is.
    cache = ("--cache-dir", str(tmp_path / "cache"))
    refused = kubectl(*cache, "--token", bad_token, "-n", namespace, "get", "pods", ok=False)
    assert refused.splitlines()[-1] == (
        "error: You must be logged in to the server "
        "(the server has asked for the client to provide credentials)"
    )
    kubectl(*cache, "-n", namespace, "get", "pods")
    refused = kubectl(*cache, "--token", bad_token, "-n", namespace, "get", "pods", ok=False)
    assert refused.splitlines()[-1] == "error: You must be logged in to the server (Unauthorized)"


def test_account_without_the_role_is_forbidden(
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
) -> None:
    key = mint_key()
    with pytest.raises(client.ApiException) as caught:
        core_as(token_for(key)).list_pod_for_all_namespaces()
    assert forbidden_body(caught.value)["message"] == (
        f'pods is forbidden: User "{key["client_id"]}" cannot list resource "pods" in API '
        'group "" at the cluster scope: requires one of ["container.pods.list"] permission(s).'
    )


def test_forbidden_names_the_email_when_the_token_carries_it(
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    sandbox: Sandbox,
    ca_file: Path,
    namespace: str,
) -> None:
    key = mint_key("roles/container.viewer")
    token = token_for(key, CLOUD_PLATFORM, EMAIL)
    batch: Api = client.BatchV1Api(api_client(sandbox.url, ca_file, token))
    assert batch.list_namespaced_job(namespace).items == []
    with pytest.raises(client.ApiException) as caught:
        batch.create_namespaced_job(namespace, {"metadata": {"name": "j"}})
    body = forbidden_body(caught.value)
    assert body["message"] == (
        f'jobs.batch is forbidden: User "{key["client_email"]}" cannot create resource "jobs" '
        f'in API group "batch" in the namespace "{namespace}": requires one of '
        '["container.jobs.create"] permission(s).'
    )
    assert body["details"] == {"group": "batch", "kind": "jobs"}


def test_egress_ip_outside_authorized_networks_is_forbidden(
    sandbox: Sandbox,
    sandbox_call: Call,
    developer_token: str,
    core_as: Callable[[str], Api],
    core: Api,
) -> None:
    sandbox_call(
        sandbox.policy.update,
        {"authorizedNetworks": ["198.51.100.0/24"], "workstationIp": "198.51.100.10"},
    )
    with pytest.raises(client.ApiException) as caught:
        core_as(developer_token).list_namespace()
    message = forbidden_body(caught.value)["message"]
    assert "203.0.113.10" in message
    assert "master authorized networks (198.51.100.0/24)" in message
    assert core.list_namespace().items, "the admin at the office is not the controlplane"
    # Nobody is exempt, as on GKE: networks that leave the office out shut the admin out too.
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["203.0.113.10/32"]})
    with pytest.raises(client.ApiException) as locked:
        core.list_namespace()
    assert "the request came from 198.51.100.10" in forbidden_body(locked.value)["message"]
    sandbox_call(
        sandbox.policy.update, {"authorizedNetworks": ["198.51.100.0/24", "203.0.113.10/32"]}
    )
    assert core_as(developer_token).list_namespace().items


def test_egress_ip_outside_authorized_networks_times_out_in_timeout_mode(
    sandbox: Sandbox,
    sandbox_call: Call,
    developer_token: str,
    core_as: Callable[[str], Api],
) -> None:
    sandbox_call(
        sandbox.policy.update,
        {
            "authorizedNetworks": ["10.0.0.0/8"],
            "networkDenial": "timeout",
            "timeoutHoldSeconds": 30,
        },
    )
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_as(developer_token).list_namespace(_request_timeout=0.5)


def test_static_tokens_are_subject_to_authorized_networks(
    sandbox: Sandbox,
    sandbox_call: Call,
    core_as: Callable[[str], Api],
) -> None:
    sandbox_call(sandbox.parts.authenticator.add_static_token, "generic-token", "generic-user")
    assert core_as("generic-token").list_namespace().items
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["10.0.0.0/8"]})
    with pytest.raises(client.ApiException) as caught:
        core_as("generic-token").list_namespace()
    assert caught.value.status == 403


def test_admin_endpoints_need_the_admin_token(
    http: Callable[..., urllib3.BaseHTTPResponse],
) -> None:
    assert http("GET", "/_sandbox/access", token="nope").status == 401
    changed = http("PATCH", "/_sandbox/access", body={"egressIp": "192.0.2.7"})
    assert changed.status == 200
    assert json.loads(changed.data)["egressIp"] == "192.0.2.7"
    minted = http(
        "POST",
        "/_sandbox/service-account-keys",
        body={"project": "demo", "account": "via-http", "roles": [DEVELOPER]},
    )
    assert json.loads(minted.data)["client_email"] == "via-http@demo.iam.gserviceaccount.com"


def test_an_expired_token_is_unauthorized_from_an_allowed_network(
    sandbox: Sandbox,
    sandbox_call: Call,
    http: Callable[..., urllib3.BaseHTTPResponse],
    developer_token: str,
    core_as: Callable[[str], Api],
) -> None:
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["203.0.113.10/32"]})
    assert core_as(developer_token).list_namespace().items
    expired = http("POST", "/_sandbox/tokens/expire")
    assert expired.status == 200
    assert json.loads(expired.data)["expired"] >= 1
    with pytest.raises(client.ApiException) as caught:
        core_as(developer_token).list_namespace()
    assert caught.value.status == 401
    assert status_of(caught.value) == UNAUTHORIZED
    # In timeout mode too: an allowed source gets its answer, the 401, not a dropped packet.
    sandbox_call(sandbox.policy.update, {"networkDenial": "timeout", "timeoutHoldSeconds": 30})
    with pytest.raises(client.ApiException) as held:
        core_as(developer_token).list_namespace(_request_timeout=5)
    assert held.value.status == 401
    # From a source off the networks, the token does not matter: the network refuses first.
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["10.0.0.0/8"]})
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_as(developer_token).list_namespace(_request_timeout=0.5)
    sandbox_call(sandbox.policy.update, {"networkDenial": "forbidden"})
    with pytest.raises(client.ApiException) as refused:
        core_as(developer_token).list_namespace()
    assert forbidden_body(refused.value)["message"].startswith("Forbidden: the request came")


def test_a_revoked_keys_tokens_are_unauthorized_once_revoked_too(
    sandbox: Sandbox,
    sandbox_call: Call,
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
) -> None:
    key = mint_key(DEVELOPER)
    token = token_for(key)
    sandbox_call(sandbox.parts.authenticator.revoke_key, key["private_key_id"])
    assert core_as(token).list_namespace().items  # deleting a key leaves its tokens valid
    sandbox_call(sandbox.parts.authenticator.revoke_key, key["private_key_id"], revoke_tokens=True)
    with pytest.raises(client.ApiException) as caught:
        core_as(token).list_namespace()
    assert status_of(caught.value) == UNAUTHORIZED


def test_kube_clients_exchange_the_key_again_after_a_401(
    sandbox: Sandbox,
    sandbox_call: Call,
    http: Callable[..., urllib3.BaseHTTPResponse],
    mint_key: Callable[..., dict[str, str]],
    ca_file: Path,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_file))  # google-auth's token requests
    block = devvalues.pool_block(base64.b64encode(sandbox.ca.ca_pem).decode(), sandbox.url)
    block["kubernetes"]["credentials"] = json.dumps(mint_key(DEVELOPER))
    clients = KubeClients({"p": parse_pool("p", block)})

    def exchanges() -> int:
        count: int = sandbox_call(lambda: sandbox.parts.authenticator.exchanges)
        return count

    try:
        core: Api = client.CoreV1Api(clients.api("p"))
        before = exchanges()
        core.list_node()
        assert exchanges() == before + 1
        core.list_node()
        assert exchanges() == before + 1, "a valid token is reused"
        assert json.loads(http("POST", "/_sandbox/tokens/expire").data)["expired"] >= 1
        core.list_node()  # refused with 401, then sent again with a new token
        assert exchanges() == before + 2
        # A watch is retried before its stream starts, not halfway through it.
        sandbox_call(sandbox.expire_tokens)
        raw = core.list_namespace(watch=True, timeout_seconds=1, _preload_content=False)
        lines = [json.loads(x) for x in raw.data.decode().splitlines() if x]
        assert {line["type"] for line in lines} == {"ADDED"}
        assert namespace in {line["object"]["metadata"]["name"] for line in lines}
        assert exchanges() == before + 3
    finally:
        clients.close()
