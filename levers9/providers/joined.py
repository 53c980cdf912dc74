"""Joined clusters (`levers9 cluster join`): what the join installs, and the pool it makes (pure).

A join names the pool (`--name`), its cards (`--gpu-type`) and its nodes (`--node-selector`);
it installs, in the cluster, through whoever runs `kubectl apply` there:

- the namespace (`levers9` unless `--namespace`);
- the ServiceAccount `levers9-agent` with the least RBAC the agent needs: a ClusterRole to read
  nodes and pods cluster-wide (capacity), a Role in its namespace for Jobs, Secrets, pods and
  PodDisruptionBudgets (the worker Jobs, their Secrets, their pods' state and drained label,
  the pool's budget), and its own Secret;
- the Secret `levers9-agent` holding the one-time join token (`join-token`), where the agent
  then keeps its own token (`agent-token`);
- the agent's Deployment (one replica, the worker image's `levers9-cluster-agent`).

The controlplane keeps the join as `ClusterWorkflow` (`cluster:<name>`): the pool's spec, the
join token's SHA-256 and expiry, whether it was used. No key, no token, no cluster address.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from levers9.config import as_values, pool_values
from levers9.contract import AGENT_NAME, JOIN_TOKEN_KEY
from levers9.tokens import join_digest

JOIN_TTL = timedelta(hours=1)
JOINED_ENDPOINT = "https://joined.levers9.invalid"
"""A joined pool's `kubernetes.endpoint`: it is never dialled (the pool is reached through its
agent's tunnel), only named."""
CLUSTER_ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
]
ROLE_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "delete"]},
    # patch: a drained worker's pod is labelled out of the pool's PodDisruptionBudget.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["get", "create", "delete"],
    },
]
"""What the agent may do in its own namespace (besides its own Secret, below)."""


class JoinedCluster(BaseModel):
    """What `levers9 cluster join` asks for: the pool it makes."""

    model_config = ConfigDict(frozen=True)

    name: str
    gpu_type: str
    node_selector: dict[str, str] = Field(default_factory=dict)
    namespace: str = "levers9"
    worker_image: str
    simulated_gpus: bool = False
    """`--simulated-gpus`: its cards are simulated (the sandbox), as a values pool's
    `simulatedGpus`: the GPU check expects its container to see none."""


class ClusterState(BaseModel):
    """ClusterWorkflow's state; carried across continue-as-new as it is."""

    spec: JoinedCluster
    join_digest: str
    expires_at: datetime
    joined_at: datetime | None = None
    """When the agent first exchanged the join token (it is spent then)."""
    last_contact: datetime | None = None
    leaving: bool = False

    def exchange(self, digest: str, now: datetime) -> str:
        """ "" when `digest` is this join's unspent, unexpired token (it is spent now); else why
        it is refused, with the fix."""
        again = f"`levers9 cluster join --name {self.spec.name} ...` again for a new one"
        if digest != self.join_digest:
            return f"this join token is not the one of cluster {self.spec.name}'s join: {again}"
        if self.joined_at is not None:
            return (
                f"this join token was used at {self.joined_at.isoformat(timespec='seconds')}:"
                f" a join token works once; {again}"
            )
        if now >= self.expires_at:
            return (
                f"this join token expired at {self.expires_at.isoformat(timespec='seconds')}:"
                f" {again}"
            )
        self.joined_at = now
        return ""


def cluster_workflow_id(name: str) -> str:
    return f"cluster:{name}"


def pool_block(spec: JoinedCluster) -> dict[str, Any]:
    """The pool's block, as a `provider: kubernetes` pool of `flavor: generic` with no
    credentials (`levers9.config.joined_pool` marks it joined)."""
    pool = pool_values(
        gpu_type=spec.gpu_type,
        flavor="generic",
        endpoint=JOINED_ENDPOINT,
        namespace=spec.namespace,
        node_selector=spec.node_selector,
        worker_image=spec.worker_image,
        tunnel=True,
        simulated_gpus=spec.simulated_gpus,
    )
    return as_values(pool)


def manifests(
    spec: JoinedCluster,
    join_token: str,
    gateway_address: str,
    gateway_ca_pem: str | None,
) -> list[dict[str, Any]]:
    """What the join installs, in apply order."""
    ns = spec.namespace
    labels = {"app.kubernetes.io/name": AGENT_NAME, "levers9.io/cluster": spec.name}
    meta = {"name": AGENT_NAME, "namespace": ns, "labels": labels}
    env = [
        {"name": "LEVERS9_GATEWAY_ADDRESS", "value": gateway_address},
        {"name": "LEVERS9_CLUSTER_NAME", "value": spec.name},
        {"name": "LEVERS9_AGENT_SECRET", "value": AGENT_NAME},
        {
            "name": "LEVERS9_POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
        },
    ]
    if gateway_ca_pem is not None:
        env.append({"name": "LEVERS9_GATEWAY_TLS", "value": "true"})
        env.append({"name": "LEVERS9_GATEWAY_CA", "value": gateway_ca_pem})
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{AGENT_NAME}-{spec.name}", "labels": labels},
            "rules": CLUSTER_ROLE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{AGENT_NAME}-{spec.name}", "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{AGENT_NAME}-{spec.name}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": AGENT_NAME, "namespace": ns}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                *ROLE_RULES,
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [AGENT_NAME],
                    "verbs": ["get", "update", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": AGENT_NAME,
            },
            "subjects": [{"kind": "ServiceAccount", "name": AGENT_NAME, "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "stringData": {JOIN_TOKEN_KEY: join_token},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": AGENT_NAME}},
                "template": {
                    # A new join changes the template: `kubectl apply` rolls the agent, which
                    # spends the new join token (the old agent token is revoked by it).
                    "metadata": {
                        "labels": labels,
                        "annotations": {"levers9.io/join": join_digest(join_token)[:16]},
                    },
                    "spec": {
                        "serviceAccountName": AGENT_NAME,
                        "containers": [
                            {
                                "name": "agent",
                                "image": spec.worker_image,
                                "command": ["levers9-cluster-agent"],
                                "env": env,
                                "resources": {
                                    "requests": {"cpu": "100m", "memory": "128Mi"},
                                    "limits": {"memory": "512Mi"},
                                },
                            }
                        ],
                    },
                },
            },
        },
    ]


CLUSTER_SESSION_WORKFLOW = "ClusterSessionWorkflow"


class ClusterRoute(BaseModel):
    """Which controlplane replica holds a joined cluster's agent session: its own task queue,
    where the other replicas reach its gateway (`replicaAddress`), and which session."""

    model_config = ConfigDict(frozen=True)

    task_queue: str
    replica_address: str | None
    session_id: str


class ClusterSessionInput(BaseModel):
    """ClusterSessionWorkflow's input: the routes held, oldest first (carried across
    continue-as-new)."""

    name: str
    routes: list[ClusterRoute] = Field(default_factory=list)
    max_history_events: int = 2000


def cluster_session_workflow_id(name: str) -> str:
    return f"cluster-session:{name}"
