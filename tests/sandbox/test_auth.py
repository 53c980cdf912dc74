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
from sandbox import devvalues, pki
from sandbox.access import DEVELOPER
from sandbox.server import Sandbox
from tests.sandbox.factories import Api, api_client, status_of, unique

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
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
    core: Api,
) -> None:
    token = token_for(mint_key(DEVELOPER))
    sandbox_call(
        sandbox.policy.update,
        {"authorizedNetworks": ["198.51.100.0/24"], "workstationIp": "198.51.100.10"},
    )
    with pytest.raises(client.ApiException) as caught:
        core_as(token).list_namespace()
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
    assert core_as(token).list_namespace().items


def test_egress_ip_outside_authorized_networks_times_out_in_timeout_mode(
    sandbox: Sandbox,
    sandbox_call: Call,
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
) -> None:
    token = token_for(mint_key(DEVELOPER))
    sandbox_call(
        sandbox.policy.update,
        {
            "authorizedNetworks": ["10.0.0.0/8"],
            "networkDenial": "timeout",
            "timeoutHoldSeconds": 30,
        },
    )
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_as(token).list_namespace(_request_timeout=0.5)


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
    mint_key: Callable[..., dict[str, str]],
    token_for: Callable[..., str],
    core_as: Callable[[str], Api],
) -> None:
    token = token_for(mint_key(DEVELOPER))
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["203.0.113.10/32"]})
    assert core_as(token).list_namespace().items
    expired = http("POST", "/_sandbox/tokens/expire")
    assert expired.status == 200
    assert json.loads(expired.data)["expired"] >= 1
    with pytest.raises(client.ApiException) as caught:
        core_as(token).list_namespace()
    assert caught.value.status == 401
    assert status_of(caught.value) == UNAUTHORIZED
    # In timeout mode too: an allowed source gets its answer, the 401, not a dropped packet.
    sandbox_call(sandbox.policy.update, {"networkDenial": "timeout", "timeoutHoldSeconds": 30})
    with pytest.raises(client.ApiException) as held:
        core_as(token).list_namespace(_request_timeout=5)
    assert held.value.status == 401
    # From a source off the networks, the token does not matter: the network refuses first.
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["10.0.0.0/8"]})
    with pytest.raises(urllib3.exceptions.HTTPError):
        core_as(token).list_namespace(_request_timeout=0.5)
    sandbox_call(sandbox.policy.update, {"networkDenial": "forbidden"})
    with pytest.raises(client.ApiException) as refused:
        core_as(token).list_namespace()
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
