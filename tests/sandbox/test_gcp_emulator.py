"""The sandbox's Google Cloud APIs, driven by the real clients (google-cloud-* on REST, gcloud):
the cluster as GKE describes it, authorized networks that change whom the Kubernetes API
admits, service accounts whose keys work on the Kubernetes API once the project policy binds
them a role, stale etags and fingerprints refused, firewall rules and repositories created
once, Google's 401/403 bodies, staged faults, and keys that outlive a restart.

The sandbox runs on the test's event loop, so every blocking client call goes through
`asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import google.auth.transport.requests
import pytest
import urllib3
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.exceptions import RefreshError
from google.cloud import artifactregistry_v1, compute_v1, container_v1, resourcemanager_v3
from google.iam.v1 import policy_pb2
from google.oauth2 import service_account
from kubernetes import client as k8s

from sandbox.access import DEVELOPER
from sandbox.gcp.container import network_tag
from sandbox.gcp.env import cloud_env
from sandbox.scenario import Scenario
from sandbox.serve import RunningSandbox, start
from tests.controlplane import trusting
from tests.sandbox.factories import api_client, unique

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
PROJECT, ZONE, CLUSTER = "demo", "us-central1-a", "demo"
CLUSTER_NAME = f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}"
GCLOUD = shutil.which("gcloud")

Json = dict[str, Any]


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_access() -> None:
    """Replaces the package's emulator reset: these tests run a sandbox of their own."""


def allowed_scenario() -> Scenario:
    """The default scenario with only the caller's egress IP (127.0.0.1) authorized: these
    tests are about the APIs, not about attaching."""
    base = Scenario.load()
    network = base.network.model_copy(update={"authorized_networks": ("127.0.0.1/32",)})
    return base.model_copy(update={"network": network})


@pytest.fixture(scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningSandbox]:
    """One sandbox (default scenario) for the module."""
    sandbox = await start(allowed_scenario(), tmp_path_factory.mktemp("gcp") / "sandbox")
    try:
        with trusting(sandbox):
            yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture(autouse=True)
def _restore_access(request: pytest.FixtureRequest) -> Iterator[None]:
    """Networks, egress IP and role bindings as they were, and no faults, after each test."""
    if "running" not in request.fixturenames:
        yield
        return
    running: RunningSandbox = request.getfixturevalue("running")
    before = running.sandbox.policy.describe()
    yield
    running.sandbox.policy.update(before)
    running.gcp.faults.clear()


@pytest.fixture(scope="module")
def operator_key(running: RunningSandbox) -> Json:
    key: Json = json.loads((running.state.dir / "operator-key.json").read_text())
    return key


def credentials_for(key: Json) -> service_account.Credentials:
    credentials: service_account.Credentials = (
        service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            key, scopes=[CLOUD_PLATFORM]
        )
    )
    return credentials


def token_for(key: Json) -> str:
    """An access token for `key`, exchanged at its token_uri as google-auth does."""
    credentials = credentials_for(key)
    credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
    token = credentials.token
    assert isinstance(token, str)
    return token


class Clients:
    """The official clients on REST transport against the emulator, as one identity."""

    def __init__(self, url: str, key: Json) -> None:
        credentials = credentials_for(key)
        options = ClientOptions(api_endpoint=url)

        def make(kind: Any) -> Any:
            return kind(credentials=credentials, transport="rest", client_options=options)

        self.clusters = make(container_v1.ClusterManagerClient)
        self.firewalls = make(compute_v1.FirewallsClient)
        self.projects = make(resourcemanager_v3.ProjectsClient)
        self.registries = make(artifactregistry_v1.ArtifactRegistryClient)


@pytest.fixture(scope="module")
def operator(running: RunningSandbox, operator_key: Json) -> Clients:
    return Clients(running.gcp.url, operator_key)


class RawApi:
    """Plain HTTPS to the emulator, for IAM (no REST transport in google-cloud-iam) and for
    reading Google's error bodies as they are."""

    def __init__(self, running: RunningSandbox) -> None:
        self.url = running.gcp.url
        self.admin_token = running.sandbox.admin_token
        self._pool = urllib3.PoolManager(ca_certs=str(running.state.dir / "ca.crt"), retries=False)

    def call(
        self,
        method: str,
        path: str,
        token: str | None,
        body: Json | None = None,
    ) -> tuple[int, Json, urllib3.BaseHTTPResponse]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        answer = self._pool.request(
            method,
            self.url + path,
            headers=headers,
            body=None if body is None else json.dumps(body),
            timeout=10,
        )
        return answer.status, json.loads(answer.data or b"{}"), answer

    async def __call__(
        self, method: str, path: str, token: str | None, body: Json | None = None
    ) -> tuple[int, Json]:
        status, data, _ = await asyncio.to_thread(self.call, method, path, token, body)
        return status, data

    async def admin(self, method: str, path: str, body: Json | None = None) -> Json:
        status, data = await self(method, path, self.admin_token, body)
        assert status < 300, data
        return data


@pytest.fixture(scope="module")
def api(running: RunningSandbox) -> RawApi:
    return RawApi(running)


@pytest.fixture(scope="module")
async def operator_token(operator_key: Json) -> str:
    return await asyncio.to_thread(token_for, operator_key)


async def new_account(api: RawApi, token: str) -> tuple[str, Json]:
    """A fresh service account and a key for it, created through IAM as gcloud would."""
    account_id = unique("sa")
    status, account = await api(
        "POST", f"/v1/projects/{PROJECT}/serviceAccounts", token, {"accountId": account_id}
    )
    assert status == 200, account
    email = account["email"]
    status, created = await api(
        "POST",
        f"/v1/projects/{PROJECT}/serviceAccounts/{email}/keys",
        token,
        {"privateKeyType": "TYPE_GOOGLE_CREDENTIALS_FILE"},
    )
    assert status == 200, created
    return email, json.loads(base64.b64decode(created["privateKeyData"]))


def kube_pods(running: RunningSandbox, token: str) -> Callable[[], int]:
    """Lists pods on the Kubernetes API with `token`; returns the HTTP status."""
    core = k8s.CoreV1Api(api_client(running.sandbox.url, running.state.dir / "ca.crt", token))

    def list_pods() -> int:
        try:
            core.list_namespaced_pod("default")
        except k8s.ApiException as error:
            return int(error.status)
        return 200

    return list_pods


# -- container ---------------------------------------------------------------------------------


async def test_cluster_is_the_sandbox(running: RunningSandbox, operator: Clients) -> None:
    cluster = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    assert cluster.name == CLUSTER
    assert cluster.location == ZONE
    assert cluster.endpoint == f"127.0.0.1:{running.sandbox.port}"
    assert base64.b64decode(cluster.master_auth.cluster_ca_certificate) == running.sandbox.ca.ca_pem
    assert cluster.status == container_v1.Cluster.Status.RUNNING
    assert cluster.network == "default"
    networks = cluster.master_authorized_networks_config
    assert networks.enabled
    assert [b.cidr_block for b in networks.cidr_blocks] == ["127.0.0.1/32"]
    pools = {pool.name: pool for pool in cluster.node_pools}
    assert set(pools) == {"gpu-1x", "gpu-2x", "gpu-4x", "default-pool"}
    assert list(pools["gpu-4x"].config.tags) == [network_tag(CLUSTER)]
    assert list(pools["gpu-1x"].config.tags) == [network_tag(CLUSTER)]  # one tag per cluster
    assert pools["gpu-4x"].config.accelerators[0].accelerator_count == 4
    # gcloud's older form of the path: projects/*/zones/*/clusters/*
    zoned = await asyncio.to_thread(
        operator.clusters.get_cluster, project_id=PROJECT, zone=ZONE, cluster_id=CLUSTER
    )
    assert zoned.endpoint == cluster.endpoint


async def test_unknown_cluster_is_not_found(operator: Clients) -> None:
    with pytest.raises(gexc.NotFound):
        await asyncio.to_thread(
            operator.clusters.get_cluster, name=f"projects/{PROJECT}/locations/{ZONE}/clusters/x"
        )


async def test_authorized_networks_update_admits_a_refused_caller(
    running: RunningSandbox, operator: Clients
) -> None:
    key = running.sandbox.mint_service_account_key(project=PROJECT, account=unique("cp"))
    list_pods = kube_pods(running, await asyncio.to_thread(token_for, key))
    running.sandbox.policy.update({"egressIp": "203.0.113.50"})  # the EKS nodes were replaced
    assert await asyncio.to_thread(list_pods) == 403

    cluster = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    blocks = list(cluster.master_authorized_networks_config.cidr_blocks)
    Block = container_v1.MasterAuthorizedNetworksConfig.CidrBlock
    blocks.append(Block(display_name="controlplane", cidr_block="203.0.113.50/32"))
    update = container_v1.ClusterUpdate(
        desired_master_authorized_networks_config=container_v1.MasterAuthorizedNetworksConfig(
            enabled=True, cidr_blocks=blocks
        ),
        etag=cluster.etag,
    )
    operation = await asyncio.to_thread(
        operator.clusters.update_cluster, name=CLUSTER_NAME, update=update
    )
    assert operation.status == container_v1.Operation.Status.DONE
    assert operation.operation_type == container_v1.Operation.Type.UPDATE_CLUSTER
    polled = await asyncio.to_thread(
        operator.clusters.get_operation,
        name=f"projects/{PROJECT}/locations/{ZONE}/operations/{operation.name}",
    )
    assert polled.status == container_v1.Operation.Status.DONE

    assert await asyncio.to_thread(list_pods) == 200
    assert running.sandbox.policy.describe()["authorizedNetworks"] == [
        "127.0.0.1/32",
        "203.0.113.50/32",
    ]
    after = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    shown = {
        b.cidr_block: b.display_name for b in after.master_authorized_networks_config.cidr_blocks
    }
    assert shown == {"127.0.0.1/32": "", "203.0.113.50/32": "controlplane"}
    with pytest.raises(gexc.Conflict):  # the etag it was read with is stale now
        await asyncio.to_thread(operator.clusters.update_cluster, name=CLUSTER_NAME, update=update)


async def test_networks_changed_by_the_sandbox_admin_show_in_the_cluster(
    running: RunningSandbox, operator: Clients
) -> None:
    running.sandbox.policy.update({"authorizedNetworks": ["198.51.100.0/24"]})
    cluster = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    blocks = cluster.master_authorized_networks_config.cidr_blocks
    assert [b.cidr_block for b in blocks] == ["198.51.100.0/24"]


# -- IAM and the project's policy --------------------------------------------------------------


async def test_a_new_account_key_works_on_kubernetes_once_bound(
    running: RunningSandbox, operator: Clients, api: RawApi, operator_token: str
) -> None:
    email, key = await new_account(api, operator_token)
    assert key["type"] == "service_account"
    assert key["client_email"] == email
    assert key["token_uri"] == f"{running.gcp.url}/token"
    assert {"project_id", "private_key_id", "private_key", "client_id"} <= set(key)
    status, again = await api(
        "POST",
        f"/v1/projects/{PROJECT}/serviceAccounts",
        operator_token,
        {"accountId": email.split("@")[0]},
    )
    assert (status, again["error"]["status"]) == (409, "ALREADY_EXISTS")
    status, keys = await api(
        "GET", f"/v1/projects/{PROJECT}/serviceAccounts/{email}/keys", operator_token
    )
    assert status == 200
    assert [k["keyType"] for k in keys["keys"]] == ["USER_MANAGED"]
    assert keys["keys"][0]["name"].endswith(f"/keys/{key['private_key_id']}")
    assert "privateKeyData" not in keys["keys"][0]

    list_pods = kube_pods(running, await asyncio.to_thread(token_for, key))
    assert await asyncio.to_thread(list_pods) == 403  # trusted, but no role yet

    policy = await asyncio.to_thread(operator.projects.get_iam_policy, resource="projects/demo")
    bound = policy_pb2.Policy()
    bound.CopyFrom(policy)
    bound.bindings.add(role=DEVELOPER, members=[f"serviceAccount:{email}"])
    await asyncio.to_thread(
        operator.projects.set_iam_policy,
        request={"resource": "projects/demo", "policy": bound},
    )
    assert DEVELOPER in running.sandbox.policy.role_bindings[email]
    assert await asyncio.to_thread(list_pods) == 200

    stale = policy_pb2.Policy()
    stale.CopyFrom(policy)  # read before the binding was added
    with pytest.raises(gexc.Conflict, match="concurrent policy changes"):
        await asyncio.to_thread(
            operator.projects.set_iam_policy,
            request={"resource": "projects/demo", "policy": stale},
        )


async def test_policy_keeps_members_that_are_not_service_accounts(
    running: RunningSandbox, operator: Clients
) -> None:
    policy = await asyncio.to_thread(operator.projects.get_iam_policy, resource="projects/demo")
    assert any(
        b.role == "roles/owner"
        and "serviceAccount:levers9-operator@demo.iam.gserviceaccount.com" in b.members
        for b in policy.bindings
    )
    policy.bindings.add(role="roles/viewer", members=["user:someone@example.com"])
    await asyncio.to_thread(
        operator.projects.set_iam_policy, request={"resource": "projects/demo", "policy": policy}
    )
    again = await asyncio.to_thread(operator.projects.get_iam_policy, resource="projects/demo")
    viewers = [list(b.members) for b in again.bindings if b.role == "roles/viewer"]
    assert viewers == [["user:someone@example.com"]]


async def test_a_deleted_key_is_refused(api: RawApi, operator_token: str) -> None:
    email, key = await new_account(api, operator_token)
    path = f"/v1/projects/-/serviceAccounts/{email}/keys/{key['private_key_id']}"
    status, _ = await api("DELETE", path, operator_token)
    assert status == 200
    status, _ = await api("GET", path, operator_token)
    assert status == 404
    with pytest.raises(RefreshError):
        await asyncio.to_thread(token_for, key)


async def test_the_project_by_number_and_other_projects(
    api: RawApi, operator: Clients, operator_token: str
) -> None:
    project = await asyncio.to_thread(operator.projects.get_project, name=f"projects/{PROJECT}")
    assert project.project_id == PROJECT
    number = project.name.removeprefix("projects/")
    status, _ = await api("GET", f"/v1/projects/{number}/locations/{ZONE}/clusters", operator_token)
    assert status == 200
    status, body = await api("GET", f"/v1/projects/other/locations/{ZONE}/clusters", operator_token)
    assert (status, body["error"]["status"]) == (403, "PERMISSION_DENIED")


# -- compute -----------------------------------------------------------------------------------


async def test_firewall_rule_insert_get_patch(
    running: RunningSandbox, operator: Clients, api: RawApi, operator_token: str
) -> None:
    name = unique("levers9-controlplane-to")
    rule = compute_v1.Firewall(
        name=name,
        network="global/networks/default",
        source_ranges=["203.0.113.10/32"],
        target_tags=["gke-demo-gpu-1x-node"],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp")],
        direction="INGRESS",
    )
    firewalls = operator.firewalls
    operation = await asyncio.to_thread(firewalls.insert, project=PROJECT, firewall_resource=rule)
    await asyncio.to_thread(operation.result)
    got = await asyncio.to_thread(firewalls.get, project=PROJECT, firewall=name)
    assert list(got.source_ranges) == ["203.0.113.10/32"]
    assert list(got.target_tags) == ["gke-demo-gpu-1x-node"]
    assert got.allowed[0].I_p_protocol == "tcp"
    assert got.network.endswith(f"/projects/{PROJECT}/global/networks/default")
    assert (
        got.self_link == f"{running.gcp.url}/compute/v1/projects/{PROJECT}/global/firewalls/{name}"
    )
    assert got.creation_timestamp

    with pytest.raises(gexc.Conflict, match="already exists"):
        await asyncio.to_thread(firewalls.insert, project=PROJECT, firewall_resource=rule)

    path = f"/compute/v1/projects/{PROJECT}/global/firewalls/{name}"
    _, raw = await api("GET", path, operator_token)
    fingerprint = raw["fingerprint"]
    patch = compute_v1.Firewall(source_ranges=["203.0.113.10/32", "203.0.113.11/32"])
    operation = await asyncio.to_thread(
        firewalls.patch, project=PROJECT, firewall=name, firewall_resource=patch
    )
    await asyncio.to_thread(operation.result)
    got = await asyncio.to_thread(firewalls.get, project=PROJECT, firewall=name)
    assert list(got.source_ranges) == ["203.0.113.10/32", "203.0.113.11/32"]

    status, refused = await api(
        "PATCH", path, operator_token, {"sourceRanges": ["0.0.0.0/0"], "fingerprint": fingerprint}
    )
    assert status == 412
    assert refused["error"]["errors"][0]["reason"] == "conditionNotMet"
    _, duplicate = await api(
        "POST",
        f"/compute/v1/projects/{PROJECT}/global/firewalls",
        operator_token,
        {"name": name, "allowed": [{"IPProtocol": "tcp"}]},
    )
    assert duplicate["error"]["errors"][0]["reason"] == "alreadyExists"
    status, missing = await api("GET", path + "-gone", operator_token)
    assert (status, missing["error"]["errors"][0]["reason"]) == (404, "notFound")


# -- artifact registry -------------------------------------------------------------------------


async def test_repository_is_created_once(operator: Clients) -> None:
    parent = f"projects/{PROJECT}/locations/us-central1"
    repository_id = unique("levers9")
    Repository = artifactregistry_v1.Repository
    operation = await asyncio.to_thread(
        operator.registries.create_repository,
        parent=parent,
        repository_id=repository_id,
        repository=Repository(format_=Repository.Format.DOCKER),
    )
    created = await asyncio.to_thread(operation.result, timeout=10)
    assert created.name == f"{parent}/repositories/{repository_id}"
    got = await asyncio.to_thread(operator.registries.get_repository, name=created.name)
    assert got.format_ == Repository.Format.DOCKER
    assert got.registry_uri == f"us-central1-docker.pkg.dev/{PROJECT}/{repository_id}"
    with pytest.raises(gexc.Conflict):
        await asyncio.to_thread(
            operator.registries.create_repository,
            parent=parent,
            repository_id=repository_id,
            repository=Repository(format_=Repository.Format.DOCKER),
        )


# -- authentication, authorization, faults -----------------------------------------------------


@pytest.mark.parametrize("token", [None, "ya29.not-a-token"])
async def test_calls_without_a_valid_token_are_401(api: RawApi, token: str | None) -> None:
    status, body = await api("GET", f"/v1/{CLUSTER_NAME}", token)
    assert status == 401
    assert body["error"]["status"] == "UNAUTHENTICATED"


async def test_an_identity_without_a_role_is_403(
    running: RunningSandbox, api: RawApi, operator_token: str
) -> None:
    _, key = await new_account(api, operator_token)
    nobody = Clients(running.gcp.url, key)
    with pytest.raises(gexc.Forbidden):
        await asyncio.to_thread(nobody.clusters.get_cluster, name=CLUSTER_NAME)
    token = await asyncio.to_thread(token_for, key)
    status, body = await api("GET", f"/v1/{CLUSTER_NAME}", token)
    assert status == 403
    assert body["error"]["code"] == 403
    assert body["error"]["status"] == "PERMISSION_DENIED"
    assert "container.clusters.get" in body["error"]["message"]
    status, body = await api("GET", f"/compute/v1/projects/{PROJECT}/global/firewalls", token)
    assert (status, body["error"]["errors"][0]["reason"]) == (403, "forbidden")


async def test_a_staged_503_is_retried_by_the_client(api: RawApi, operator: Clients) -> None:
    rule = await api.admin(
        "POST",
        "/_gcp/faults",
        {"method": "GET", "pathRegex": f"/clusters/{CLUSTER}$", "status": 503, "times": 1},
    )
    cluster = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    assert cluster.name == CLUSTER
    faults = await api.admin("GET", "/_gcp/faults")
    assert [(r["id"], r["fired"]) for r in faults["rules"]] == [(rule["id"], 1)]


async def test_a_staged_fault_answers_in_googles_shape(api: RawApi, operator_token: str) -> None:
    await api.admin(
        "POST",
        "/_gcp/faults",
        {"method": "*", "pathRegex": "/global/firewalls", "status": 429, "retryAfterSeconds": 3},
    )
    path = f"/compute/v1/projects/{PROJECT}/global/firewalls"
    status, body, answer = await asyncio.to_thread(api.call, "GET", path, operator_token)
    assert (status, answer.headers["Retry-After"]) == (429, "3")
    assert body["error"]["errors"][0]["reason"] == "rateLimitExceeded"
    status, _ = await api("GET", path, operator_token)  # times defaults to one
    assert status == 200


async def test_state_is_readable_by_the_admin_only(api: RawApi, operator_token: str) -> None:
    state = await api.admin("GET", "/_gcp/state")
    assert state["project"] == PROJECT
    assert state["cluster"]["name"] == CLUSTER
    assert "levers9-operator@demo.iam.gserviceaccount.com" in {
        a["email"] for a in state["serviceAccounts"]
    }
    status, _ = await api("GET", "/_gcp/state", operator_token)
    assert status == 401


# -- the state directory -----------------------------------------------------------------------


async def test_state_dir_records_the_gcp_apis(running: RunningSandbox, operator_key: Json) -> None:
    info = json.loads((running.state.dir / "sandbox.json").read_text())
    assert info["gcpUrl"] == running.gcp.url
    assert (running.state.dir / "operator-key.json").stat().st_mode & 0o777 == 0o600
    assert operator_key["client_email"] == "levers9-operator@demo.iam.gserviceaccount.com"
    assert operator_key["token_uri"] == f"{running.gcp.url}/token"
    env = cloud_env(running.state.dir)
    assert env["LEVERS9_GCP_ENDPOINT"] == running.gcp.url
    assert env["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"] == f"{running.gcp.url}/compute/v1/"
    assert env["CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER"] == f"{running.gcp.url}/"
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == str(running.state.dir / "operator-key.json")
    assert env["CLOUDSDK_CONFIG"].startswith(str(running.state.dir))


async def test_keys_and_bindings_survive_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "sandbox"
    first = await start(allowed_scenario(), directory)
    operator_key = json.loads((directory / "operator-key.json").read_text())
    try:
        with trusting(first):
            operator_token = await asyncio.to_thread(token_for, operator_key)
            email, key = await new_account(RawApi(first), operator_token)
            clients = Clients(first.gcp.url, operator_key)
            policy = await asyncio.to_thread(
                clients.projects.get_iam_policy, resource="projects/demo"
            )
            policy.bindings.add(role=DEVELOPER, members=[f"serviceAccount:{email}"])
            await asyncio.to_thread(
                clients.projects.set_iam_policy,
                request={"resource": "projects/demo", "policy": policy},
            )
    finally:
        await first.close()
    second = await start(allowed_scenario(), directory)
    try:
        with trusting(second):
            assert json.loads((directory / "operator-key.json").read_text()) == operator_key
            list_pods = kube_pods(second, await asyncio.to_thread(token_for, key))
            assert await asyncio.to_thread(list_pods) == 200
            token = await asyncio.to_thread(token_for, operator_key)
            status, keys = await RawApi(second)(
                "GET", f"/v1/projects/{PROJECT}/serviceAccounts/{email}/keys", token
            )
            assert status == 200
            assert [k["name"].rsplit("/", 1)[1] for k in keys["keys"]] == [key["private_key_id"]]
    finally:
        await second.close()


# -- gcloud ------------------------------------------------------------------------------------


@pytest.mark.skipif(GCLOUD is None, reason="gcloud is not on PATH (the Google Cloud SDK)")
async def test_gcloud_sees_what_the_clients_made(
    running: RunningSandbox, operator: Clients
) -> None:
    env = {**os.environ, **cloud_env(running.state.dir)}

    def gcloud(*args: str) -> Json:
        done = subprocess.run(
            [str(GCLOUD), *args, "--format=json"],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        answer: Json = json.loads(done.stdout)
        return answer

    running.sandbox.policy.update({"authorizedNetworks": ["127.0.0.1/32", "203.0.113.0/24"]})
    described = await asyncio.to_thread(
        gcloud, "container", "clusters", "describe", CLUSTER, "--zone", ZONE
    )
    cluster = await asyncio.to_thread(operator.clusters.get_cluster, name=CLUSTER_NAME)
    blocks = [b.cidr_block for b in cluster.master_authorized_networks_config.cidr_blocks]
    assert blocks == ["127.0.0.1/32", "203.0.113.0/24"]
    assert [
        b["cidrBlock"] for b in described["masterAuthorizedNetworksConfig"]["cidrBlocks"]
    ] == blocks
    assert described["endpoint"] == cluster.endpoint

    name = unique("levers9-gcloud")
    rule = compute_v1.Firewall(
        name=name,
        source_ranges=["203.0.113.10/32"],
        target_tags=["gke-demo-gpu-2x-node"],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp")],
    )
    operation = await asyncio.to_thread(
        operator.firewalls.insert, project=PROJECT, firewall_resource=rule
    )
    await asyncio.to_thread(operation.result)
    shown = await asyncio.to_thread(gcloud, "compute", "firewall-rules", "describe", name)
    assert shown["name"] == name
    assert shown["sourceRanges"] == ["203.0.113.10/32"]
    assert shown["targetTags"] == ["gke-demo-gpu-2x-node"]
    assert shown["allowed"] == [{"IPProtocol": "tcp"}]
    assert (running.state.dir / "gcloud").is_dir()
