"""The cloud side end to end on the sandbox, as an operator drives it: `attach-gke-pool.sh`
against the GCP emulator, moto and two real registries, then egress-IP rotation by a Temporal
signal (`temporal workflow signal ... rotate_ips`, and `levers9 egress rotate`).

- Before attach the controlplane's calls are refused (403: not on the authorized networks).
- Attach creates the service account, its role, the key (0600, never printed), the registry,
  the image copy, one firewall rule and the authorized networks; prints a values block that the
  project's loader takes, and with the key the controlplane is admitted.
- A second attach changes nothing and says so; still one firewall rule.
- EKS nodes replaced: 403 again, until `rotate_ips` appends the new IPs (never removing any).
- A bad IP in the signal is answered in the rotation record; a stale etag (409) and a firewall
  precondition failure (412) are retried; an identity without roles is told what to get (403).

The tests of this module share one world and run in order.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.aws import AwsActivities
from activities.gcp import GcpActivities, gcp_clients
from activities.kube_clients import KubeClients, build_api_client
from activities.pools import PoolActivities
from levers9.config import ControlplaneSettings, parse_pool
from levers9.devstack import values as devvalues
from levers9.providers.gke import Allowlist, egress_workflow_id
from sandbox import aws, registries
from sandbox.gcp.container import network_tag
from tests.cloud import BIN, OFFICE, OFFICE_IP, CloudWorld, cloud_world, run
from tests.controlplane import admin_api, trusting
from tests.waiting import eventually
from workflows.egress import EgressAllowlistWorkflow

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def world(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[CloudWorld]:
    task_queue = f"tq-{uuid.uuid4()}"
    directory = tmp_path_factory.mktemp("cloud")
    address = dev_env.client.service_client.config.target_host
    async with cloud_world(directory, address, task_queue) as w:
        with trusting(w.running):
            yield w


@pytest.fixture(scope="module")
async def controlplane_worker(
    dev_env: WorkflowEnvironment, world: CloudWorld
) -> AsyncIterator[Worker]:
    """The controlplane's Temporal worker for the egress workflow, with its own Google and AWS
    identity (here the operator's key, through the environment the sandbox gives)."""
    env = world.env
    settings = ControlplaneSettings.model_validate(
        {"temporalAddress": env["TEMPORAL_ADDRESS"], "taskQueue": env["LEVERS9_TASK_QUEUE"]}
    )
    from google.oauth2 import service_account

    credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
        env["GOOGLE_APPLICATION_CREDENTIALS"],
        scopes=["https://www.googleapis.com/auth/cloud-platform"],
    )
    gcp = GcpActivities(lambda: gcp_clients(env["LEVERS9_GCP_ENDPOINT"], credentials))
    import boto3

    def session() -> boto3.session.Session:
        return boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )

    aws_activities = AwsActivities(session=lambda: _Endpoint(session(), world.moto.endpoint))
    pools = PoolActivities(dev_env.client, KubeClients({}), settings)
    async with Worker(
        dev_env.client,
        task_queue=settings.task_queue,
        workflows=[EgressAllowlistWorkflow],
        activities=[
            gcp.append_authorized_networks,
            gcp.ensure_firewall,
            aws_activities.discover_egress_ips,
            pools.ensure_egress_workflow,
        ],
    ) as worker:
        yield worker


class _Endpoint:
    """A boto3 session whose clients talk to moto."""

    def __init__(self, session: Any, endpoint: str) -> None:
        self._session, self._endpoint = session, endpoint

    def client(self, name: str) -> Any:
        return self._session.client(name, endpoint_url=self._endpoint)


def _steps(stdout: str) -> dict[str, str]:
    """The step lines attach prints before its `done:` line: `  <name>: <status> (<detail>)`
    -> {name: status}."""
    steps = {}
    for line in stdout[: stdout.index("\ndone: ")].splitlines():
        if line.startswith("  "):
            head = line.strip().split(" (", 1)[0]
            name, _, status = head.rpartition(": ")
            steps[name] = status
    return steps


def _values_block(stdout: str) -> dict[str, Any]:
    start = stdout.index("Paste under config.worker.pools")
    text = stdout[start:].split("\n", 2)[2]
    block_text = text[: text.index("\nThe key is in")]
    parsed: dict[str, Any] = yaml.safe_load(block_text)
    return parsed


async def _kube_status(world: CloudWorld, key_file: Path) -> int:
    """What the Kubernetes API answers the controlplane (its key, from its egress IP)."""
    ca = base64.b64encode(world.running.sandbox.ca.ca_pem).decode()
    block = devvalues.pool_block(ca, world.running.sandbox.url)
    block["kubernetes"]["credentials"] = await asyncio.to_thread(key_file.read_text)
    pool = parse_pool("probe", block)

    def call() -> int:
        api = build_api_client(pool, key_file.parent)
        try:
            k8s.CoreV1Api(api).list_node(_request_timeout=10)
        except k8s.ApiException as exc:
            return int(exc.status)
        finally:
            api.close()  # type: ignore[no-untyped-call]
        return 200

    return await asyncio.to_thread(call)


async def _firewalls(world: CloudWorld) -> list[dict[str, Any]]:
    code, out, err = await run(
        "gcloud", "compute", "firewall-rules", "list", "--format=json", env=world.env, within=120
    )
    assert code == 0, err
    rules: list[dict[str, Any]] = json.loads(out)
    return rules


async def test_before_attach_the_controlplane_is_not_on_the_authorized_networks(
    world: CloudWorld,
) -> None:
    assert world.authorized_networks() == [OFFICE]
    assert world.running.sandbox.policy.egress_ip == world.seeded.node_ips[0]


async def test_attach_creates_everything_once_and_prints_the_values_block(
    world: CloudWorld, controlplane_worker: Worker
) -> None:
    code, out, err = await world.attach()
    assert code == 0, out + err
    steps = _steps(out)
    email = f"levers9-controlplane@{world.project}.iam.gserviceaccount.com"
    assert steps[f"service account {email}"] == "created"
    assert steps["IAM binding roles/container.developer"] == "created"
    assert steps[f"key {world.key_file}"] == "created"
    assert steps["Artifact Registry repository levers9 in us-central1"] == "created"
    assert steps[f"firewall rule levers9-controlplane-to-{world.cluster}"] == "created"
    assert steps["authorized networks"] == "updated"
    # The key: written once, private, never printed.
    assert world.key_file.stat().st_mode & 0o777 == 0o600
    key = json.loads(world.key_file.read_text())
    assert key["client_email"] == email
    assert key["private_key_id"] not in out + err
    assert "PRIVATE KEY" not in out + err
    # The values block parses with the project's loader once the key completes it.
    block = _values_block(out)["gke-rtx6000"]
    block["kubernetes"]["credentials"] = world.key_file.read_text()
    pool = parse_pool("gke-rtx6000", block)
    assert pool.kubernetes.endpoint == world.running.sandbox.url
    assert pool.kubernetes.worker_image == (
        f"us-central1-docker.pkg.dev/{world.project}/levers9/worker:latest"
    )
    # Authorized networks: the office kept, the egress IPs (nodes and NAT) appended.
    egress = [f"{ip}/32" for ip in world.seeded.egress_ips]
    networks = world.authorized_networks()
    assert networks[0] == OFFICE
    assert sorted(networks[1:]) == sorted(egress)
    # The image is in the project's registry now, the same digest as the controlplane's.
    digest = await asyncio.to_thread(
        registries.manifest_digest, world.gar.address, f"{world.project}/levers9/worker", "latest"
    )
    aws_digest = await asyncio.to_thread(
        registries.manifest_digest, world.ecr.address, "levers9/worker", "latest"
    )
    assert digest is not None
    assert digest == aws_digest
    # With its key, from its egress IP, the controlplane is admitted.
    assert await _kube_status(world, world.key_file) == 200


async def test_a_second_attach_changes_nothing_and_says_so(world: CloudWorld) -> None:
    before = world.key_file.read_text()
    code, out, err = await world.attach()
    assert code == 0, out + err
    statuses = {name: s for name, s in _steps(out).items() if name != "egress IPs"}
    assert set(statuses.values()) == {"unchanged"}, out
    assert "done: 0 changed" in out
    assert world.key_file.read_text() == before
    rules = await _firewalls(world)
    ours = [r for r in rules if r["name"] == f"levers9-controlplane-to-{world.cluster}"]
    assert len(ours) == 1
    egress = {f"{ip}/32" for ip in world.seeded.egress_ips}
    assert set(ours[0]["sourceRanges"]) == egress
    assert ours[0]["targetTags"] == [network_tag(world.cluster)]
    assert ours[0]["allowed"] == [{"IPProtocol": "tcp"}]


async def test_attach_for_a_tunnel_only_pool_skips_the_firewall_and_says_so(
    world: CloudWorld,
) -> None:
    code, out, err = await world.attach("--tunnel")
    assert code == 0, out + err
    steps = _steps(out)
    assert steps[f"firewall rule levers9-controlplane-to-{world.cluster}"] == "skipped"
    assert "tunnel-only pool" in out
    block = _values_block(out)["gke-rtx6000"]
    assert block["hostNetwork"] is False
    assert block["kubernetes"]["tunnel"] is True


async def test_gcloud_shows_the_same_authorized_networks(world: CloudWorld) -> None:
    code, out, err = await run(
        "gcloud",
        *("container", "clusters", "describe", world.cluster, "--zone", world.location),
        "--format=json(masterAuthorizedNetworksConfig)",
        env=world.env,
        within=120,
    )
    assert code == 0, err
    config = json.loads(out)["masterAuthorizedNetworksConfig"]
    assert config["enabled"] is True
    assert [b["cidrBlock"] for b in config["cidrBlocks"]] == world.authorized_networks()


async def _rotations(client: Client, cluster: str) -> Allowlist:
    handle = client.get_workflow_handle(egress_workflow_id(cluster))
    result: Allowlist = await handle.query("allowlist", result_type=Allowlist)
    return result


async def test_replaced_eks_nodes_are_refused_until_rotate_ips_appends_them(
    world: CloudWorld, dev_env: WorkflowEnvironment, controlplane_worker: Worker
) -> None:
    before = world.authorized_networks()
    new_ips = await asyncio.to_thread(aws.replace_eks_nodes, world.moto.endpoint)
    world.set_egress_ip(new_ips[0])
    assert await _kube_status(world, world.key_file) == 403

    # The operator's signal, from the Temporal CLI, discovering the IPs (empty input).
    code, out, err = await run(
        str(BIN / "temporal"),
        *("workflow", "signal", "--workflow-id", egress_workflow_id(world.cluster)),
        *("--name", "rotate_ips", "--input", "{}"),
        "--address",
        world.env["TEMPORAL_ADDRESS"],
        env=world.env,
    )
    assert code == 0, out + err

    async def rotated() -> bool:
        state = await _rotations(dev_env.client, world.cluster)
        return len(state.rotations) == 1

    await eventually(rotated, within=60)
    rotation = (await _rotations(dev_env.client, world.cluster)).rotations[0]
    assert rotation.error == ""
    assert sorted(rotation.added) == sorted(f"{ip}/32" for ip in new_ips)
    after = world.authorized_networks()
    assert after[: len(before)] == before  # nothing removed, order kept
    assert set(after) == set(before) | {f"{ip}/32" for ip in new_ips}
    assert await _kube_status(world, world.key_file) == 200
    rules = await _firewalls(world)
    [ours] = [r for r in rules if r["name"] == f"levers9-controlplane-to-{world.cluster}"]
    assert {f"{ip}/32" for ip in new_ips} <= set(ours["sourceRanges"])


async def test_levers9_egress_rotate_appends_named_ips_and_answers_a_bad_one(
    world: CloudWorld, controlplane_worker: Worker
) -> None:
    code, out, err = await world.levers9(
        "egress", "rotate", "--cluster", world.cluster, "--ip", "192.0.2.44"
    )
    assert code == 0, out + err
    assert "added 192.0.2.44/32" in out
    assert "192.0.2.44/32" in world.authorized_networks()

    code, out, err = await world.levers9(
        "egress", "rotate", "--cluster", world.cluster, "--ip", "192.0.2.45", "--ip", "nope"
    )
    assert code == 1
    assert "ips[1]: 'nope' is not an IPv4 address" in err
    assert "192.0.2.45/32" not in world.authorized_networks()

    code, out, err = await world.levers9("egress", "show", "--cluster", world.cluster, "-o", "json")
    assert code == 0, err
    shown = json.loads(out)
    assert "192.0.2.44/32" in shown["allowlist"]
    assert [bool(r["error"]) for r in shown["rotations"]] == [False, False, True]


async def test_races_are_read_again_and_merged(
    world: CloudWorld, controlplane_worker: Worker
) -> None:
    """A 409 on the cluster update and a 412 on the firewall patch (someone changed them since
    we read them) are read again and merged, not lost; a 503 is retried by Temporal."""
    faults = world.running.gcp.faults
    faults.add({"method": "PUT", "pathRegex": "/clusters/", "status": 409, "times": 1})
    faults.add({"method": "PATCH", "pathRegex": "/firewalls/", "status": 412, "times": 1})
    faults.add({"method": "GET", "pathRegex": "/firewalls/", "status": 503, "times": 1})
    code, out, err = await world.levers9(
        "egress", "rotate", "--cluster", world.cluster, "--ip", "192.0.2.46"
    )
    assert code == 0, out + err
    assert "192.0.2.46/32" in world.authorized_networks()
    assert all(rule.exhausted for rule in faults.rules()), [r.describe() for r in faults.rules()]
    faults.clear()


async def test_an_identity_without_roles_is_told_what_to_grant(
    world: CloudWorld, tmp_path: Path
) -> None:
    iam = world.running.gcp.iam
    iam.ensure_account(world.project, "nobody")
    key = iam.mint_key(f"nobody@{world.project}.iam.gserviceaccount.com")
    key_path = tmp_path / "nobody.json"
    key_path.write_text(json.dumps(key))
    env = {**world.env, "GOOGLE_APPLICATION_CREDENTIALS": str(key_path)}
    env["LEVERS9_GKE_KEY_FILE"] = str(tmp_path / "never.json")
    code, out, err = await world.attach(env=env)
    assert code == 1, out + err
    assert "attach failed: cluster projects/" in err
    assert "403" in err
    assert "roles/container.clusterAdmin" in err
    assert not (tmp_path / "never.json").exists()


async def test_attach_on_a_cluster_without_authorized_networks_refuses_unless_told(
    world: CloudWorld, controlplane_worker: Worker
) -> None:
    """A cluster whose API answers any address: enabling authorized networks with only the
    controlplane's IPs would lock out kubectl and CI, so attach refuses and says why, and
    changes nothing; `--enable-authorized-networks` turns them on and prints what it adds."""
    before = world.authorized_networks()
    world.running.sandbox.policy.set_authorized_networks(None)  # disabled: open to all
    try:
        code, out, err = await world.attach()
        assert code == 1, out + err
        assert "has master authorized networks disabled (its API answers any address)" in err
        assert "would lock out kubectl, CI and everyone else" in err
        assert "--enable-authorized-networks" in err
        assert world.running.sandbox.policy.authorized_networks is None  # still open
        # The egress workflow's rotations leave such a cluster alone.
        code, out, err = await world.levers9(
            "egress", "rotate", "--cluster", world.cluster, "--ip", "192.0.2.47"
        )
        assert code == 0, out + err
        assert world.running.sandbox.policy.authorized_networks is None
        code, out, err = await world.attach("--enable-authorized-networks", "--ip", "192.0.2.48")
        assert code == 0, out + err
        assert _steps(out)["authorized networks"] == "updated"
        assert "enabled with " in out
        assert "192.0.2.48/32" in world.authorized_networks()
        # What the refusal guards against: the office (the admin's kubectl) is shut out now.
        assert OFFICE not in world.authorized_networks()
        core = k8s.CoreV1Api(admin_api(world.running))
        with pytest.raises(k8s.ApiException) as locked:
            await asyncio.to_thread(core.list_namespace)
        assert locked.value.status == 403
        assert f"the request came from {OFFICE_IP}" in str(locked.value.body)
    finally:
        world.running.sandbox.policy.set_authorized_networks(before)
