"""Joined clusters (`levers9.providers.joined`, pure): the join token is spent once, before it
expires; what the join installs grants the agent the least it needs; the pool it makes loads as a
tunnel-mode pool with no credentials."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from levers9.config import joined_pool, parse_pool
from levers9.providers.joined import (
    CLUSTER_ROLE_RULES,
    ClusterState,
    JoinedCluster,
    manifests,
    pool_block,
)
from levers9.tokens import agent_token, agent_token_matches, join_digest

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = JoinedCluster(
    name="joined",
    gpu_type="RTXPro6000",
    node_selector={"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
    worker_image="registry.example/levers9/worker:1",
)


def _state() -> ClusterState:
    return ClusterState(
        spec=SPEC, join_digest=join_digest("l9j1.t"), expires_at=T0 + timedelta(hours=1)
    )


def test_the_join_token_is_spent_once() -> None:
    state = _state()
    assert state.exchange(join_digest("l9j1.t"), T0) == ""
    again = state.exchange(join_digest("l9j1.t"), T0 + timedelta(minutes=1))
    assert again.startswith("this join token was used at 2026-12-01T00:00:00+00:00")
    assert "`levers9 cluster join --name joined ...` again" in again


def test_an_expired_or_foreign_join_token_is_refused() -> None:
    expired = _state().exchange(join_digest("l9j1.t"), T0 + timedelta(hours=1))
    assert expired.startswith("this join token expired at 2026-12-01T01:00:00+00:00")
    foreign = _state().exchange(join_digest("l9j1.other"), T0)
    assert foreign.startswith("this join token is not the one of cluster joined's join")


def test_the_agent_token_is_the_joins_own() -> None:
    token = agent_token("secret", "joined", join_digest("l9j1.t"))
    assert agent_token_matches("secret", "joined", join_digest("l9j1.t"), token)
    assert not agent_token_matches("secret", "joined", join_digest("l9j1.new"), token)
    assert not agent_token_matches("secret", "other", join_digest("l9j1.t"), token)
    assert "secret" not in token


def test_the_agent_gets_the_least_rbac_it_needs() -> None:
    documents = manifests(SPEC, "l9j1.t", "gateway.example:7443", None)
    by_kind = {d["kind"]: d for d in documents}
    # Cluster-wide: read nodes and pods, nothing else.
    assert CLUSTER_ROLE_RULES == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}
    ]
    cluster_verbs = {v for r in by_kind["ClusterRole"]["rules"] for v in r["verbs"]}
    assert cluster_verbs == {"get", "list", "watch"}
    role = by_kind["Role"]
    assert role["metadata"]["namespace"] == "levers9"
    writes = {
        (tuple(r["resources"]), tuple(r.get("resourceNames", ())))
        for r in role["rules"]
        if set(r["verbs"]) - {"get", "list", "watch"}
    }
    assert writes == {
        (("jobs",), ()),
        (("secrets",), ()),
        (("secrets",), ("levers9-agent",)),
        (("pods",), ()),  # patch: a drained worker's pod leaves the pool's disruption budget
        (("poddisruptionbudgets",), ()),
    }
    pod_writes = {v for r in role["rules"] if r["resources"] == ["pods"] for v in r["verbs"]}
    assert pod_writes - {"get", "list", "watch"} == {"patch"}, "never create or delete pods"
    assert by_kind["Secret"]["stringData"] == {"join-token": "l9j1.t"}
    [container] = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["levers9-cluster-agent"]
    assert container["image"] == SPEC.worker_image
    assert "l9j1.t" not in str(container), "the join token only in its Secret"


def test_the_pool_a_join_makes_is_the_block_written_by_hand() -> None:
    """What `pool_block` wrote as a dict before the builder (levers9.config.pool_values)."""
    spec = SPEC.model_copy(update={"namespace": "gpus", "simulated_gpus": True})
    assert pool_block(spec) == {
        "mode": "external",
        "provider": "kubernetes",
        "gpuType": "RTXPro6000",
        "hostNetwork": False,
        "kubernetes": {
            "flavor": "generic",
            "endpoint": "https://joined.levers9.invalid",
            "namespace": "gpus",
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
            "workerImage": "registry.example/levers9/worker:1",
            "tunnel": True,
        },
        "simulatedGpus": True,
    }
    assert pool_block(SPEC)["simulatedGpus"] is False
    assert pool_block(SPEC)["kubernetes"]["namespace"] == "levers9"


def test_the_pool_a_join_makes_is_a_tunnel_pool_with_no_credentials() -> None:
    pool = joined_pool("joined", pool_block(SPEC))
    assert pool.kubernetes.joined
    assert pool.kubernetes.tunnel
    assert not pool.host_network
    assert pool.kubernetes.resolved_credentials() is None
    assert pool.kubernetes.node_selector == SPEC.node_selector
    assert not parse_pool("joined", pool_block(SPEC)).kubernetes.joined, "only a join marks it"
