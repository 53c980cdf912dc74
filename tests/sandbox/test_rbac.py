"""Kubernetes service accounts and RBAC, as a pod's in-cluster client meets them: tokens the
sandbox signs (TokenRequest, `kubectl create token`, the kubelet's mounted token read by
`InClusterConfigLoader` in a pod process), 401 once the account or the pod is gone or the token
expired, pods refused (and a Deployment's retried) without their account, RBAC grants through
Role/ClusterRole bindings with the apiserver's 403 texts, escalation refused, discovery open,
`kubectl auth whoami|can-i` and `--as`, and the GKE authorized networks not applying to callers
inside the cluster."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client

from sandbox.cluster import Cluster
from sandbox.kubeconfig import write_kubeconfig
from sandbox.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIG_MAPS,
    DEPLOYMENTS,
    EVENTS,
    NAMESPACES,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
)
from sandbox.server import LOOPBACK, Sandbox, SandboxOptions, start_sandbox
from sandbox.serviceaccounts import TOKEN_MOUNT_PATH
from tests.sandbox.cluster.kit import CPU_NODE, PYTHON_IMAGE, fast_scenario, wait_for
from tests.sandbox.factories import (
    Api,
    api_client,
    job_manifest,
    pod_manifest,
    seed_pod,
    status_of,
    unique,
)

Call = Callable[..., Any]
Kubectl = Callable[..., str]
RBAC = "rbac.authorization.k8s.io"


def user(namespace: str, name: str = "agent") -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def rule(groups: list[str], resources: list[str], verbs: list[str], **more: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **more}


@pytest.fixture
def rbac_api(admin_client: client.ApiClient) -> Api:
    return client.RbacAuthorizationV1Api(admin_client)


@pytest.fixture
def other_namespace(sandbox: Sandbox, sandbox_call: Call) -> str:
    name = unique("other")
    sandbox_call(sandbox.registry.create, NAMESPACES, {"metadata": {"name": name}})
    return name


@pytest.fixture
def account(core: Api, namespace: str) -> str:
    """A ServiceAccount `agent` in the test's namespace, with no grants yet."""
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    return "agent"


@pytest.fixture
def token(sandbox: Sandbox, sandbox_call: Call, namespace: str, account: str) -> str:
    issued: str = sandbox_call(sandbox.service_account_token, namespace, account)
    return issued


@pytest.fixture
def as_token(sandbox: Sandbox, ca_file: Path) -> Callable[[str], client.ApiClient]:
    return lambda token: api_client(sandbox.url, ca_file, token)


@pytest.fixture
def agent_client(token: str, as_token: Callable[[str], client.ApiClient]) -> client.ApiClient:
    """A client that calls as the account `agent` of the test's namespace."""
    return as_token(token)


@pytest.fixture
def agent_lists_pods(rbac_api: Api, namespace: str) -> None:
    """The account `agent` may list the pods of the test's namespace."""
    grant(rbac_api, namespace, [rule([""], ["pods"], ["list"])])


def core_api(api: client.ApiClient) -> Api:
    return client.CoreV1Api(api)


def batch_api(api: client.ApiClient) -> Api:
    return client.BatchV1Api(api)


def rbac_of(api: client.ApiClient) -> Api:
    return client.RbacAuthorizationV1Api(api)


@pytest.fixture
def cluster_bindings(sandbox: Sandbox, sandbox_call: Call) -> Iterator[list[str]]:
    """Names of cluster-scoped RBAC objects a test made, deleted after it (the emulator is
    shared by the module's tests)."""
    made: list[str] = []
    yield made

    def clean() -> None:
        for resource in (CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES):
            for name in made:
                if sandbox.store.exists(resource, None, name):
                    sandbox.registry.delete(resource, None, name)

    sandbox_call(clean)


def grant(
    rbac_api: Api, namespace: str, rules: list[dict[str, Any]], *, subject: str = "agent"
) -> str:
    """A Role with `rules` bound to the account `subject` of `namespace`."""
    name = unique("role")
    rbac_api.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac_api.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}],
        },
    )
    return name


def forbidden(call: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as raised:
        call()
    assert raised.value.status == 403, raised.value.body
    return status_of(raised.value)


def unauthorized(call: Callable[[], Any]) -> None:
    with pytest.raises(client.ApiException) as raised:
        call()
    assert raised.value.status == 401, raised.value.body
    assert status_of(raised.value)["message"] == "Unauthorized"


# -- grants and denials -------------------------------------------------------------------------


def test_a_granted_list_works_and_an_ungranted_create_is_forbidden(
    sandbox: Sandbox,
    sandbox_call: Call,
    rbac_api: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    sandbox_call(seed_pod, sandbox.registry, namespace, "model-0")
    grant(rbac_api, namespace, [rule([""], ["pods"], ["get", "list", "watch"])])
    listed = core_api(agent_client).list_namespaced_pod(namespace)
    assert [p.metadata.name for p in listed.items] == ["model-0"]
    assert core_api(agent_client).read_namespaced_pod("model-0", namespace).metadata.name

    status = forbidden(
        lambda: batch_api(agent_client).create_namespaced_job(namespace, job_manifest("j"))
    )
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            f'jobs.batch is forbidden: User "{user(namespace)}" cannot create resource "jobs" '
            f'in API group "batch" in the namespace "{namespace}"'
        ),
        "reason": "Forbidden",
        "details": {"group": "batch", "kind": "jobs"},
        "code": 403,
    }
    deleting = forbidden(lambda: core_api(agent_client).delete_namespaced_pod("model-0", namespace))
    assert deleting["message"] == (
        f'pods "model-0" is forbidden: User "{user(namespace)}" cannot delete resource "pods" '
        f'in API group "" in the namespace "{namespace}"'
    )
    assert deleting["details"] == {"name": "model-0", "kind": "pods"}


def test_a_namespaced_grant_does_not_reach_another_namespace(
    rbac_api: Api,
    namespace: str,
    other_namespace: str,
    agent_client: client.ApiClient,
) -> None:
    grant(rbac_api, namespace, [rule([""], ["pods"], ["*"])])
    core = core_api(agent_client)
    assert core.list_namespaced_pod(namespace).items == []
    elsewhere = forbidden(lambda: core.list_namespaced_pod(other_namespace))
    assert elsewhere["message"] == (
        f'pods is forbidden: User "{user(namespace)}" cannot list resource "pods" in API group '
        f'"" in the namespace "{other_namespace}"'
    )
    everywhere = forbidden(core.list_pod_for_all_namespaces)
    assert everywhere["message"] == (
        f'pods is forbidden: User "{user(namespace)}" cannot list resource "pods" in API group '
        '"" at the cluster scope'
    )
    nodes = forbidden(core.list_node)
    assert nodes["message"].endswith(
        'cannot list resource "nodes" in API group "" at the cluster scope'
    )


def test_a_cluster_role_binding_grants_cluster_wide_reads(
    sandbox: Sandbox,
    sandbox_call: Call,
    rbac_api: Api,
    namespace: str,
    other_namespace: str,
    cluster_bindings: list[str],
    agent_client: client.ApiClient,
) -> None:
    sandbox_call(seed_pod, sandbox.registry, other_namespace, "elsewhere")
    name = unique("reader")
    cluster_bindings.append(name)
    rbac_api.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [rule([""], ["pods", "nodes", "namespaces"], ["get", "list", "watch"])],
        }
    )
    rbac_api.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}],
        }
    )
    core = core_api(agent_client)
    assert [p.metadata.name for p in core.list_namespaced_pod(other_namespace).items] == [
        "elsewhere"
    ]
    assert "elsewhere" in {p.metadata.name for p in core.list_pod_for_all_namespaces().items}
    core.list_node()
    assert core.read_namespace(other_namespace).metadata.name == other_namespace
    # Reads only: the role grants no write anywhere.
    forbidden(lambda: core.delete_namespaced_pod("elsewhere", other_namespace))


def test_a_role_binding_to_a_cluster_role_grants_it_in_its_namespace_only(
    rbac_api: Api,
    namespace: str,
    other_namespace: str,
    agent_client: client.ApiClient,
) -> None:
    # The bootstrapped `edit` (aggregated from system:aggregate-to-edit and -view), bound in
    # one namespace, and a Group subject naming every account of the namespace.
    rbac_api.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "editors"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"},
            "subjects": [
                {"kind": "Group", "name": f"system:serviceaccounts:{namespace}", "apiGroup": RBAC}
            ],
        },
    )
    batch = batch_api(agent_client)
    batch.create_namespaced_job(namespace, job_manifest("allowed"))
    assert [j.metadata.name for j in batch.list_namespaced_job(namespace).items] == ["allowed"]
    forbidden(lambda: batch.create_namespaced_job(other_namespace, job_manifest("refused")))


def test_subresources_resource_names_and_missing_roles(
    sandbox: Sandbox,
    sandbox_call: Call,
    core: Api,
    rbac_api: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    sandbox_call(seed_pod, sandbox.registry, namespace, "p")
    for name in ("allowed", "other"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})
    grant(
        rbac_api,
        namespace,
        [
            rule([""], ["pods"], ["get"]),
            rule([""], ["configmaps"], ["get", "watch", "list"], resourceNames=["allowed"]),
        ],
    )
    agent = core_api(agent_client)
    agent.read_namespaced_pod("p", namespace)
    logs = forbidden(lambda: agent.read_namespaced_pod_log("p", namespace))
    assert logs["message"] == (
        f'pods "p" is forbidden: User "{user(namespace)}" cannot get resource "pods/log" in API '
        f'group "" in the namespace "{namespace}"'
    )
    assert agent.read_namespaced_config_map("allowed", namespace).metadata.name == "allowed"
    other = forbidden(lambda: agent.read_namespaced_config_map("other", namespace))
    assert other["message"].startswith(f'configmaps "other" is forbidden: User "{user(namespace)}"')
    # A list names no object, unless it selects one by name (what a watch of one object does).
    forbidden(lambda: agent.list_namespaced_config_map(namespace))
    one = agent.list_namespaced_config_map(namespace, field_selector="metadata.name=allowed")
    assert [c.metadata.name for c in one.items] == ["allowed"]

    # A binding whose role does not exist grants nothing, and the 403 says why.
    rbac_api.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "dangling"},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "missing"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent"}],
        },
    )
    status = forbidden(lambda: agent.list_namespaced_secret(namespace))
    assert status["message"].endswith(f': RBAC: role.{RBAC} "missing" not found')


def test_discovery_is_open_and_other_paths_are_not(
    http: Callable[..., urllib3.BaseHTTPResponse], namespace: str, token: str
) -> None:
    for path in ("/api", "/api/v1", "/apis", "/apis/batch/v1", "/version", "/openapi/v3"):
        assert http("GET", path, token=token).status == 200, path
    refused = http("GET", "/metrics", token=token)
    assert refused.status == 403
    assert json.loads(refused.data)["message"] == (
        f'forbidden: User "{user(namespace)}" cannot get path "/metrics"'
    )


def test_escalation_is_refused(
    rbac_api: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    grant(
        rbac_api,
        namespace,
        [
            rule([RBAC], ["roles", "rolebindings"], ["create", "get", "patch"]),
            rule([""], ["pods"], ["get", "list"]),
        ],
    )
    agent = rbac_of(agent_client)
    # What it holds, it may hand on ...
    agent.create_namespaced_role(
        namespace, {"metadata": {"name": "readers"}, "rules": [rule([""], ["pods"], ["list"])]}
    )
    agent.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "readers"},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "readers"},
            "subjects": [{"kind": "ServiceAccount", "name": "helper", "namespace": namespace}],
        },
    )
    # ... but not more.
    groups = (
        f'["system:serviceaccounts" "system:serviceaccounts:{namespace}" "system:authenticated"]'
    )
    wider = forbidden(
        lambda: agent.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "wider"},
                "rules": [
                    rule([""], ["pods"], ["delete", "list"]),
                    rule(["batch"], ["jobs"], ["create"]),
                ],
            },
        )
    )
    assert wider["message"] == (
        f'roles.{RBAC} "wider" is forbidden: user "{user(namespace)}" (groups={groups}) is '
        "attempting to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}\n'
        '{APIGroups:["batch"], Resources:["jobs"], Verbs:["create"]}'
    )
    admin = forbidden(
        lambda: agent.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "admin"},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}],
            },
        )
    )
    assert admin["message"].startswith(
        f'rolebindings.{RBAC} "admin" is forbidden: user "{user(namespace)}"'
    )
    # A patch is checked on what it would store.
    patched = forbidden(
        lambda: agent.patch_namespaced_role(
            "readers", namespace, {"rules": [rule(["*"], ["*"], ["*"])]}
        )
    )
    assert (
        'not currently held:\n{APIGroups:["*"], Resources:["*"], Verbs:["*"]}'
        in (patched["message"])
    )


# -- tokens -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("agent_lists_pods")
def test_a_token_for_a_deleted_service_account_is_unauthorized(
    core: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    agent = core_api(agent_client)
    agent.list_namespaced_pod(namespace)
    core.delete_namespaced_service_account("agent", namespace)
    unauthorized(lambda: agent.list_namespaced_pod(namespace))
    # An account made again under the name is another account: the old token stays refused.
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    unauthorized(lambda: agent.list_namespaced_pod(namespace))


@pytest.mark.usefixtures("agent_lists_pods")
def test_expired_foreign_and_wrong_audience_tokens_are_unauthorized(
    sandbox: Sandbox,
    sandbox_call: Call,
    core: Api,
    namespace: str,
    token: str,
    as_token: Callable[[str], client.ApiClient],
) -> None:
    expired = sandbox_call(
        sandbox.service_account_token, namespace, "agent", expiration_seconds=-120
    )
    unauthorized(lambda: core_api(as_token(expired)).list_namespaced_pod(namespace))
    vault = core.create_namespaced_service_account_token(
        "agent", namespace, {"spec": {"audiences": ["vault"]}}
    ).status.token
    unauthorized(lambda: core_api(as_token(vault)).list_namespaced_pod(namespace))
    header, claims, signature = token.split(".")
    forged_claims = json.loads(base64.urlsafe_b64decode(claims + "=="))
    forged_claims["sub"] = "system:serviceaccount:kube-system:default"
    forged = ".".join(
        [
            header,
            base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=").decode(),
            signature,
        ]
    )
    unauthorized(lambda: core_api(as_token(forged)).list_namespaced_pod(namespace))


@pytest.mark.usefixtures("agent_lists_pods")
def test_token_request_claims_and_a_token_bound_to_a_pod(
    sandbox: Sandbox,
    sandbox_call: Call,
    core: Api,
    namespace: str,
    account: str,
    as_token: Callable[[str], client.ApiClient],
) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            **pod_manifest("runner"),
            "spec": {**pod_manifest("runner")["spec"], "serviceAccountName": "agent"},
        },
    )
    pod = core.read_namespaced_pod("runner", namespace)
    answer = core.create_namespaced_service_account_token(
        "agent",
        namespace,
        {
            "spec": {
                "expirationSeconds": 1200,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "runner"},
            }
        },
    )
    assert answer.spec.bound_object_ref.uid == pod.metadata.uid
    assert answer.spec.audiences == ["https://kubernetes.default.svc.cluster.local"]
    claims = json.loads(base64.urlsafe_b64decode(answer.status.token.split(".")[1] + "=="))
    assert claims["sub"] == user(namespace)
    assert claims["exp"] - claims["iat"] == 1200
    account_uid = core.read_namespaced_service_account("agent", namespace).metadata.uid
    assert claims["kubernetes.io"] == {
        "namespace": namespace,
        "pod": {"name": "runner", "uid": pod.metadata.uid},
        "serviceaccount": {"name": "agent", "uid": account_uid},
    }
    agent = core_api(as_token(answer.status.token))
    assert [p.metadata.name for p in agent.list_namespaced_pod(namespace).items] == ["runner"]
    core.delete_namespaced_pod("runner", namespace, grace_period_seconds=0)
    unauthorized(lambda: agent.list_namespaced_pod(namespace))

    with pytest.raises(client.ApiException) as short:
        core.create_namespaced_service_account_token(
            "agent", namespace, {"spec": {"expirationSeconds": 60}}
        )
    assert short.value.status == 422
    assert status_of(short.value)["message"] == (
        'TokenRequest.authentication.k8s.io "agent" is invalid: spec.expirationSeconds: '
        "Invalid value: 60: may not specify a duration less than 10 minutes"
    )


def test_kubectl_create_token_authenticates(
    kubectl: Kubectl,
    sandbox: Sandbox,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
    cluster_bindings: list[str],
) -> None:
    kubectl("-n", namespace, "create", "serviceaccount", "agent")
    kubectl("-n", namespace, "create", "role", "reader", "--verb=get,list", "--resource=pods")
    kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "reader",
        "--role=reader",
        f"--serviceaccount={namespace}:agent",
    )
    name = unique("nodes")
    cluster_bindings.append(name)
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(
        f"""apiVersion: {RBAC}/v1
kind: ClusterRole
metadata:
  name: {name}
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list]
---
apiVersion: {RBAC}/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
roleRef:
  apiGroup: {RBAC}
  kind: ClusterRole
  name: {name}
subjects:
- kind: ServiceAccount
  name: agent
  namespace: {namespace}
"""
    )
    assert kubectl("apply", "-f", str(manifest)).split("\n")[:2] == [
        f"clusterrole.{RBAC}/{name} created",
        f"clusterrolebinding.{RBAC}/{name} created",
    ]
    assert name in kubectl("get", "clusterroles", "-o", "name")
    assert "cluster-admin" in kubectl("get", "clusterroles")
    bindings = kubectl("-n", namespace, "get", "rolebindings", "-o", "wide")
    assert "Role/reader" in bindings
    assert f"{namespace}/agent" in bindings

    token = kubectl("-n", namespace, "create", "token", "agent").strip()
    config = write_kubeconfig(
        tmp_path / "agent.kubeconfig",
        server=sandbox.url,
        ca_pem=sandbox.ca.ca_pem,
        token=token,
        user=f"{namespace}-agent",
        namespace=namespace,
    )
    as_agent = ("--kubeconfig", str(config))
    assert kubectl(*as_agent, "get", "pods", "-o", "name") == ""
    kubectl(*as_agent, "get", "nodes")
    refused = kubectl(*as_agent, "-n", other_namespace, "get", "pods", ok=False)
    assert refused.strip() == (
        f'Error from server (Forbidden): pods is forbidden: User "{user(namespace)}" cannot list '
        f'resource "pods" in API group "" in the namespace "{other_namespace}"'
    )
    short = kubectl("-n", namespace, "create", "token", "agent", "--duration=1m", ok=False)
    assert "may not specify a duration less than 10 minutes" in short
    missing = kubectl("-n", namespace, "create", "token", "nobody", ok=False)
    assert 'serviceaccounts "nobody" not found' in missing

    kubectl("delete", "-f", str(manifest))
    assert name not in kubectl("get", "clusterroles", "-o", "name")
    kubectl(*as_agent, "get", "nodes", ok=False)


@pytest.mark.usefixtures("agent_lists_pods")
def test_authorized_networks_do_not_apply_to_service_accounts(
    sandbox: Sandbox,
    sandbox_call: Call,
    core: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    sandbox_call(sandbox.policy.update, {"authorizedNetworks": ["198.51.100.0/24"]})
    # The admin's kubectl (the workstation) and the controlplane's egress are outside ...
    refused = forbidden(lambda: core.list_namespaced_pod(namespace))
    assert "master authorized networks" in refused["message"]
    # ... while a pod calls from inside the cluster.
    assert core_api(agent_client).list_namespaced_pod(namespace).items == []


# -- pods and their accounts --------------------------------------------------------------------


def test_a_pod_of_a_missing_service_account_is_refused(core: Api, namespace: str) -> None:
    manifest = pod_manifest("p")
    manifest["spec"]["serviceAccountName"] = "ghost"
    status = forbidden(lambda: core.create_namespaced_pod(namespace, manifest))
    assert status["message"] == (
        f'pods "p" is forbidden: error looking up service account {namespace}/ghost: '
        'serviceaccount "ghost" not found'
    )


def test_pods_get_the_token_volume_unless_automount_is_off(
    core: Api, namespace: str, sandbox: Sandbox, sandbox_call: Call
) -> None:
    accounts = core.list_namespaced_service_account(namespace).items
    assert [a.metadata.name for a in accounts] == ["default"]
    root_ca = core.read_namespaced_config_map("kube-root-ca.crt", namespace)
    assert root_ca.data["ca.crt"] == sandbox.ca.ca_pem.decode()

    core.create_namespaced_pod(namespace, pod_manifest("mounted"))
    spec = sandbox_call(sandbox.registry.get, PODS, namespace, "mounted")["spec"]
    (volume,) = spec["volumes"]
    assert volume["name"].startswith("kube-api-access-")
    assert len(volume["name"]) == len("kube-api-access-") + 5
    assert volume["projected"] == {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
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
    }
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": volume["name"], "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}
    ]

    off = pod_manifest("off")
    off["spec"]["automountServiceAccountToken"] = False
    assert core.create_namespaced_pod(namespace, off).spec.volumes is None
    core.create_namespaced_service_account(
        namespace, {"metadata": {"name": "quiet"}, "automountServiceAccountToken": False}
    )
    quiet = pod_manifest("quiet")
    quiet["spec"]["serviceAccountName"] = "quiet"
    assert core.create_namespaced_pod(namespace, quiet).spec.volumes is None

    # The default account comes back when deleted, as the controller recreates it.
    old = core.read_namespaced_service_account("default", namespace).metadata.uid
    core.delete_namespaced_service_account("default", namespace)
    assert core.read_namespaced_service_account("default", namespace).metadata.uid != old
    assert sandbox_call(sandbox.store.exists, SERVICE_ACCOUNTS, namespace, "default")
    assert sandbox_call(sandbox.store.exists, CONFIG_MAPS, namespace, "kube-root-ca.crt")


_IN_CLUSTER = """
import base64, json, os
from kubernetes import client, config
mounts = json.loads(os.environ["LEVERS9_SANDBOX_MOUNTS"])
root = mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
configuration = client.Configuration()
config.incluster_config.InClusterConfigLoader(
    token_filename=os.path.join(root, "token"), cert_filename=os.path.join(root, "ca.crt")
).load_and_set(configuration)
namespace = open(os.path.join(root, "namespace")).read()
claims = open(os.path.join(root, "token")).read().split(".")[1]
core = client.CoreV1Api(client.ApiClient(configuration))
out = {
    "namespace": namespace,
    "claims": json.loads(base64.urlsafe_b64decode(claims + "==")),
    "pods": [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
}
try:
    core.list_namespaced_pod("default")
except client.ApiException as error:
    out["elsewhere"] = [error.status, json.loads(error.body)["message"]]
print(json.dumps(out))
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A sandbox of this test's own with its cluster: kubelets that run pods as processes and
    give them the API's address and their tokens."""
    sandbox = await start_sandbox(SandboxOptions())
    cluster = Cluster(
        sandbox.registry, fast_scenario(), tmp_path / "state", api_address=(LOOPBACK, sandbox.port)
    )
    try:
        await cluster.start()
        cluster.registry.create(NAMESPACES, {"metadata": {"name": "agents"}})
        yield cluster
    finally:
        await cluster.stop()
        await sandbox.close()


async def test_a_pod_uses_its_mounted_token_with_in_cluster_config(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(SERVICE_ACCOUNTS, {"metadata": {"name": "agent"}}, namespace="agents")
    registry.create(
        ROLES,
        {"metadata": {"name": "pods"}, "rules": [rule([""], ["pods"], ["list"])]},
        namespace="agents",
    )
    registry.create(
        ROLE_BINDINGS,
        {
            "metadata": {"name": "pods"},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent"}],
        },
        namespace="agents",
    )
    registry.create(
        PODS,
        {
            "metadata": {"name": "agent"},
            "spec": {
                "serviceAccountName": "agent",
                "nodeName": CPU_NODE,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": PYTHON_IMAGE,
                        "command": ["python", "-c", _IN_CLUSTER],
                    }
                ],
            },
        },
        namespace="agents",
    )

    def finished() -> dict[str, Any] | None:
        pod = registry.get(PODS, "agents", "agent")
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    done = await wait_for(finished, within=60)
    output = registry.logs.read("agents", "agent", "main")
    assert done["status"]["phase"] == "Succeeded", output
    seen = json.loads(output.strip().splitlines()[-1])
    claims = seen.pop("claims")
    assert seen == {
        "namespace": "agents",
        "pods": ["agent"],
        "elsewhere": [
            403,
            'pods is forbidden: User "system:serviceaccount:agents:agent" cannot list '
            'resource "pods" in API group "" in the namespace "default"',
        ],
    }
    # The kubelet's token is bound to the pod (and its node), valid for the year the API
    # extends the 3607 s a kubelet asks for to.
    private = claims["kubernetes.io"]
    assert private["pod"] == {"name": "agent", "uid": done["metadata"]["uid"]}
    assert private["node"]["name"] == CPU_NODE
    assert private["serviceaccount"]["name"] == "agent"
    assert claims["exp"] - claims["iat"] == 365 * 24 * 3600
    assert private["warnafter"] == claims["iat"] + 3607


async def test_a_deployment_waits_for_its_service_account(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(
        DEPLOYMENTS,
        {
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "serviceAccountName": "agent",
                        "containers": [
                            {
                                "name": "main",
                                "image": PYTHON_IMAGE,
                                "command": ["python", "-c", "import time; time.sleep(600)"],
                            }
                        ],
                    },
                },
            },
        },
        namespace="agents",
    )

    def failed_create() -> str | None:
        for event in registry.list(EVENTS, "agents").items():
            if event.get("reason") == "FailedCreate":
                return str(event["message"])
        return None

    message = await wait_for(failed_create)
    assert message.startswith('Error creating: pods "agent-')
    assert message.endswith(
        '-" is forbidden: error looking up service account agents/agent: '
        'serviceaccount "agent" not found'
    )
    assert registry.list(PODS, "agents").items() == []

    registry.create(SERVICE_ACCOUNTS, {"metadata": {"name": "agent"}}, namespace="agents")

    def running() -> dict[str, Any] | None:
        pods = registry.list(PODS, "agents").items()
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    pod = await wait_for(running, within=30)
    (volume,) = pod["spec"]["volumes"]
    files = (
        cluster.node_root(pod["spec"]["nodeName"])
        / "var/lib/kubelet/pods"
        / pod["metadata"]["uid"]
        / "volumes/kubernetes.io~projected"
        / volume["name"]
    )
    assert sorted(p.name for p in files.iterdir()) == ["ca.crt", "namespace", "token"]
    assert (files / "namespace").read_text() == "agents"
    assert registry.service_accounts.authenticate((files / "token").read_text()) is not None


# -- a caller about itself: kubectl auth whoami | can-i, and --as -------------------------------


def test_kubectl_auth_whoami_can_i_and_impersonation(
    kubectl: Kubectl,
    sandbox: Sandbox,
    sandbox_call: Call,
    rbac_api: Api,
    namespace: str,
    token: str,
    tmp_path: Path,
) -> None:
    grant(rbac_api, namespace, [rule([""], ["pods", "pods/log"], ["get", "list"])])
    config = write_kubeconfig(
        tmp_path / "agent.kubeconfig",
        server=sandbox.url,
        ca_pem=sandbox.ca.ca_pem,
        token=token,
        user="agent",
        namespace=namespace,
    )
    as_agent = ("--kubeconfig", str(config))
    whoami = kubectl(*as_agent, "auth", "whoami").split("\n")
    assert whoami[1].split() == ["Username", user(namespace)]
    assert whoami[2].split(None, 1) == [
        "Groups",
        f"[system:serviceaccounts system:serviceaccounts:{namespace} system:authenticated]",
    ]
    assert kubectl(*as_agent, "auth", "can-i", "list", "pods").strip() == "yes"
    assert kubectl(*as_agent, "auth", "can-i", "get", "pods/log").strip() == "yes"
    kubectl(*as_agent, "auth", "can-i", "delete", "pods", ok=False)  # "no", exit status 1
    assert kubectl(*as_agent, "auth", "can-i", "get", "/version").strip() == "yes"
    listed = kubectl(*as_agent, "auth", "can-i", "--list")
    assert any(line.split()[:1] == ["pods/log"] for line in listed.splitlines())

    # The admin asks as the agent, and acts as it: what the agent may not, it may not.
    agent = f"--as={user(namespace)}"
    assert kubectl("-n", namespace, "auth", "can-i", "list", "pods", agent).strip() == "yes"
    kubectl("-n", namespace, "auth", "can-i", "create", "jobs", agent, ok=False)
    sandbox_call(seed_pod, sandbox.registry, namespace, "p")
    assert kubectl("-n", namespace, "get", "pods", agent, "-o", "name").split() == ["pod/p"]
    refused = kubectl("-n", namespace, "delete", "pod", "p", agent, ok=False)
    assert refused.strip() == (
        f'Error from server (Forbidden): pods "p" is forbidden: User "{user(namespace)}" cannot '
        f'delete resource "pods" in API group "" in the namespace "{namespace}"'
    )
    # A service account may impersonate only what RBAC lets it.
    denied = kubectl(*as_agent, "get", "pods", "--as=system:admin", ok=False)
    assert denied.strip() == (
        f'Error from server (Forbidden): users "system:admin" is forbidden: User '
        f'"{user(namespace)}" cannot impersonate resource "users" in API group "" at the '
        "cluster scope"
    )


def test_self_subject_access_reviews_with_the_official_client(
    admin_client: client.ApiClient,
    rbac_api: Api,
    namespace: str,
    agent_client: client.ApiClient,
) -> None:
    grant(rbac_api, namespace, [rule(["batch"], ["jobs"], ["create"])])

    def review(api: client.ApiClient, verb: str, ns: str) -> bool:
        attributes = {"namespace": ns, "verb": verb, "group": "batch", "resource": "jobs"}
        authorization: Api = client.AuthorizationV1Api(api)
        answer = authorization.create_self_subject_access_review(
            {"spec": {"resourceAttributes": attributes}}
        )
        return bool(answer.status.allowed)

    assert review(agent_client, "create", namespace)
    assert not review(agent_client, "delete", namespace)
    assert not review(agent_client, "create", "default")
    assert review(admin_client, "delete", "default")
    authorization: Api = client.AuthorizationV1Api(agent_client)
    rules = authorization.create_self_subject_rules_review({"spec": {"namespace": namespace}})
    assert {"verbs": ["create"], "api_groups": ["batch"], "resources": ["jobs"]} in [
        {k: v for k, v in r.to_dict().items() if v is not None} for r in rules.status.resource_rules
    ]
    assert rules.status.incomplete is False
