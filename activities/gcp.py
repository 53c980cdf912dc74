"""The GCP side of a GKE pool: retryable, idempotent activities over the official google-cloud
clients on their REST transport (one endpoint override reaches the sandbox's emulator).

Each step reads first and writes only what is missing, so a rerun changes nothing except the
egress IPs it appends, and says so (`Step.status`: created, unchanged, updated):

- `ensure_service_account`: `levers9-controlplane@<project>`.
- `ensure_developer_binding`: project IAM `roles/container.developer` for it, read-modify-write
  with the policy's etag, read again on a concurrent change (409).
- `ensure_key`: a key written once to the key file (0600) on this machine; never returned,
  logged or put in history. Kept while the account still lists the file's key.
- `ensure_repository`: Artifact Registry docker repository `levers9` in the cluster's region.
- `ensure_firewall`: `levers9-controlplane-to-<cluster>`, egress IPs -> the node pool's tags,
  all TCP; only appended to (a 409/412 from a concurrent change reads and merges again).
- `append_authorized_networks`: the cluster's master authorized networks, existing CIDRs kept.
- `describe_cluster`: endpoint, CA, network, node pools' network tags.

Errors: 401/403 name the permission to get and who lacks it, 404 names the flag to check; all
non-retryable. 409/412 are read-modify-write races and are retried inside the step; 429/5xx and
timeouts are raised for Temporal to retry with backoff.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import google.auth
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import (
    artifactregistry_v1,
    compute_v1,
    container_v1,
    resourcemanager_v3,
)
from temporalio import activity
from temporalio.exceptions import ApplicationError

from levers9.files import write_private
from levers9.logs import get_logger
from levers9.providers.gke import (
    DEVELOPER_ROLE,
    REPOSITORY_ID,
    SERVICE_ACCOUNT_ID,
    ClusterInfo,
    ClusterRef,
    FirewallInput,
    KeyInput,
    NetworksInput,
    Step,
    appended,
)
from levers9.telemetry import span

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RACE_ATTEMPTS = 5
DISABLED_DETAIL = "disabled: the cluster's API answers any address, nothing to add"
"""Read-modify-write rounds a step tries before it lets Temporal retry it."""
OPERATION_TIMEOUT_S = 300.0
DISPLAY_NAME = "levers9 controlplane"
IAM_ENDPOINT = "https://iam.googleapis.com"
HTTP_TIMEOUT_S = 60.0


class IamRest:
    """The four IAM v1 calls attach makes, over REST. google-cloud-iam's `iam_admin_v1` has
    no REST transport, so this speaks the same paths (`iam.googleapis.com/v1`) through
    google-auth's AuthorizedSession; errors become the same `google.api_core` exceptions the
    other clients raise."""

    def __init__(self, credentials: Credentials, endpoint: str | None) -> None:
        self._session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
        self._base = (endpoint or IAM_ENDPOINT).rstrip("/") + "/v1/"

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._session.request(  # type: ignore[no-untyped-call]
            method, self._base + path, json=body, timeout=HTTP_TIMEOUT_S
        )
        if response.status_code >= 400:
            raise gexc.from_http_response(response)  # type: ignore[no-untyped-call]
        return response.json() if response.content else {}

    def get_service_account(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", name)
        return result

    def create_service_account(self, project: str, account_id: str, display_name: str) -> None:
        body = {"accountId": account_id, "serviceAccount": {"displayName": display_name}}
        self._request("POST", f"projects/{project}/serviceAccounts", body)

    def list_user_managed_keys(self, account: str) -> list[str]:
        """The key ids of `account` (a `projects/*/serviceAccounts/*` name)."""
        result = self._request("GET", f"{account}/keys?keyTypes=USER_MANAGED")
        return [str(k["name"]).rsplit("/", 1)[-1] for k in result.get("keys", [])]

    def create_key(self, account: str) -> bytes:
        """A new key; returns the JSON key file's bytes (`privateKeyData`, decoded)."""
        result = self._request("POST", f"{account}/keys", {})
        return base64.b64decode(result["privateKeyData"])


log = get_logger(__name__)
T = TypeVar("T")


@dataclass
class GcpClients:
    """The five Google Cloud clients the cloud side uses, built once per process."""

    container: container_v1.ClusterManagerClient
    firewalls: compute_v1.FirewallsClient
    iam: IamRest
    projects: resourcemanager_v3.ProjectsClient
    registry: artifactregistry_v1.ArtifactRegistryClient


def gcp_clients(endpoint: str | None, credentials: Credentials | None = None) -> GcpClients:
    """Clients on the REST transport; `endpoint` (LEVERS9_GCP_ENDPOINT) overrides every API's
    host, for the sandbox's emulator. Credentials default to Application Default Credentials
    (`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS)."""
    if credentials is None:
        try:
            credentials, _ = google.auth.default(scopes=list(SCOPES))
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise ValueError(
                "no Google credentials: run `gcloud auth application-default login`, or set"
                " GOOGLE_APPLICATION_CREDENTIALS to a key file"
            ) from exc
    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    common: dict[str, Any] = {
        "credentials": credentials,
        "transport": "rest",
        "client_options": options,
    }
    return GcpClients(
        container=container_v1.ClusterManagerClient(**common),
        firewalls=compute_v1.FirewallsClient(**common),
        iam=IamRest(credentials, endpoint),
        projects=resourcemanager_v3.ProjectsClient(**common),
        registry=artifactregistry_v1.ArtifactRegistryClient(**common),
    )


def _permanent(exc: gexc.GoogleAPICallError, what: str, fix: str) -> ApplicationError:
    return ApplicationError(
        f"{what}: {exc.code} {getattr(exc, 'reason', None) or type(exc).__name__}:"
        f" {exc.message}; {fix}",
        type=f"Gcp{exc.code}",
        non_retryable=True,
    )


async def _call(fn: Callable[[], T], what: str, *, not_found: str = "") -> T:
    """Runs one client call off the event loop and maps its failure (see the module doc)."""
    try:
        with span(f"gcp {what}"):
            return await asyncio.to_thread(fn)
    except (gexc.Unauthorized, gexc.Unauthenticated) as exc:
        raise _permanent(
            exc, what, "the credentials were refused: `gcloud auth application-default login`"
        ) from None
    except (gexc.Forbidden, gexc.PermissionDenied) as exc:
        raise _permanent(
            exc,
            what,
            "the identity lacks the permission: run attach as a project owner, or grant"
            " roles/container.clusterAdmin, roles/compute.securityAdmin,"
            " roles/iam.serviceAccountAdmin, roles/iam.serviceAccountKeyAdmin,"
            " roles/resourcemanager.projectIamAdmin and roles/artifactregistry.admin",
        ) from None
    except gexc.NotFound as exc:
        if not not_found:
            raise
        raise _permanent(exc, what, not_found) from None
    except (gexc.BadRequest, gexc.InvalidArgument) as exc:
        raise _permanent(exc, what, "the request was refused as invalid") from None


class GcpActivities:
    """Activities over injected clients: tests and the sandbox pass clients on the emulator."""

    def __init__(self, clients: Callable[[], GcpClients]) -> None:
        self._clients_factory = clients
        self._clients: GcpClients | None = None

    @property
    def clients(self) -> GcpClients:
        if self._clients is None:
            try:
                self._clients = self._clients_factory()
            except ValueError as exc:
                raise ApplicationError(str(exc), type="NoCredentials", non_retryable=True) from exc
        return self._clients

    # -- the cluster ----------------------------------------------------------------------

    @activity.defn
    async def describe_cluster(self, ref: ClusterRef) -> ClusterInfo:
        cluster = await _call(
            lambda: self.clients.container.get_cluster(name=ref.cluster_path),
            f"cluster {ref.cluster_path}",
            not_found="check --project, --zone and --cluster (gcloud container clusters list)",
        )
        tags = {pool.name: list(pool.config.tags) for pool in cluster.node_pools}
        return ClusterInfo(
            endpoint=cluster.endpoint,
            ca_certificate=cluster.master_auth.cluster_ca_certificate,
            network=cluster.network or "default",
            node_pool_tags=tags,
        )

    @activity.defn
    async def append_authorized_networks(self, input: NetworksInput) -> Step:
        ref = input.cluster
        name = "authorized networks"
        for _ in range(RACE_ATTEMPTS):
            cluster = await _call(
                lambda: self.clients.container.get_cluster(name=ref.cluster_path),
                f"cluster {ref.cluster_path}",
                not_found="check --project, --zone and --cluster",
            )
            config = cluster.master_authorized_networks_config
            existing = [block.cidr_block for block in config.cidr_blocks]
            _, added = appended(existing, input.cidrs)
            if not config.enabled:
                if input.when_disabled == "leave":
                    return Step(name=name, status="unchanged", detail=DISABLED_DETAIL)
                if input.when_disabled == "refuse":
                    raise ApplicationError(
                        f"{name}: cluster {ref.cluster} has master authorized networks"
                        " disabled (its API answers any address); enabling them with only the"
                        f" controlplane's IPs ({', '.join(input.cidrs)}) would lock out kubectl,"
                        " CI and everyone else. Rerun with --enable-authorized-networks (add"
                        " your own CIDRs with --ip), or enable them yourself first with the CIDRs"
                        " you need (gcloud container clusters update ..."
                        " --enable-master-authorized-networks --master-authorized-networks ...)"
                        " and rerun: attach appends ours",
                        type="AuthorizedNetworksDisabled",
                        non_retryable=True,
                    )
            elif not added:
                return Step(name=name, status="unchanged", detail=f"{len(existing)} CIDRs")
            blocks = [*config.cidr_blocks]
            blocks += [
                container_v1.MasterAuthorizedNetworksConfig.CidrBlock(
                    display_name="levers9-controlplane", cidr_block=cidr
                )
                for cidr in added
            ]
            update = container_v1.ClusterUpdate(
                desired_master_authorized_networks_config=container_v1.MasterAuthorizedNetworksConfig(
                    enabled=True, cidr_blocks=blocks
                )
            )
            try:
                operation = await _call(
                    lambda update=update: self.clients.container.update_cluster(  # type: ignore[misc]
                        name=ref.cluster_path, update=update
                    ),
                    f"update {ref.cluster_path}",
                )
            except (gexc.FailedPrecondition, gexc.Conflict):
                # Another operation in progress, or a change since we read: read again.
                await asyncio.sleep(2)
                continue
            await self._wait_container(ref, operation.name)
            detail = ("enabled with " if not config.enabled else "added ") + ", ".join(added)
            log.info("authorized networks appended", cluster=ref.cluster, added=",".join(added))
            return Step(name=name, status="updated", detail=detail)
        raise ApplicationError(f"{name}: the cluster stayed busy; will retry")

    async def _wait_container(self, ref: ClusterRef, operation: str) -> None:
        path = f"projects/{ref.project}/locations/{ref.location}/operations/{operation}"
        deadline = asyncio.get_running_loop().time() + OPERATION_TIMEOUT_S
        while True:
            op = await _call(
                lambda: self.clients.container.get_operation(name=path), f"operation {operation}"
            )
            if op.status == container_v1.Operation.Status.DONE:
                if op.error and op.error.message:
                    raise ApplicationError(f"operation {operation} failed: {op.error.message}")
                return
            if asyncio.get_running_loop().time() > deadline:
                raise ApplicationError(f"operation {operation} still running; will retry")
            activity.heartbeat(operation)
            await asyncio.sleep(1)

    # -- the firewall ---------------------------------------------------------------------

    @activity.defn
    async def ensure_firewall(self, input: FirewallInput) -> Step:
        ref = input.cluster
        name = f"firewall rule {ref.firewall_name}"
        firewalls = self.clients.firewalls
        for _ in range(RACE_ATTEMPTS):
            try:
                rule = await _call(
                    lambda: firewalls.get(project=ref.project, firewall=ref.firewall_name),
                    name,
                )
            except gexc.NotFound:
                wanted, _ = appended([], input.cidrs)
                resource = compute_v1.Firewall(
                    name=ref.firewall_name,
                    network=f"projects/{ref.project}/global/networks/{input.network}",
                    direction="INGRESS",
                    source_ranges=wanted,
                    target_tags=input.target_tags,
                    allowed=[compute_v1.Allowed(I_p_protocol="tcp")],
                    description="levers9 controlplane -> GPU workers (logs, proxy)",
                )
                try:
                    operation = await _call(
                        lambda r=resource: firewalls.insert(  # type: ignore[misc]
                            project=ref.project, firewall_resource=r
                        ),
                        f"create {name}",
                    )
                except gexc.Conflict:
                    continue  # created by a concurrent run: read it
                await asyncio.to_thread(operation.result, OPERATION_TIMEOUT_S)
                return Step(name=name, status="created", detail=", ".join(wanted))
            merged, added = appended(list(rule.source_ranges), input.cidrs)
            tags = [*rule.target_tags, *(t for t in input.target_tags if t not in rule.target_tags)]
            if not added and tags == list(rule.target_tags):
                return Step(name=name, status="unchanged", detail=f"{len(merged)} source ranges")
            # Firewall writes are last-writer-wins on Google Cloud (no fingerprint); a 412 or 409
            # from a concurrent change makes us read and merge again.
            patch = compute_v1.Firewall(source_ranges=merged, target_tags=tags)
            try:
                operation = await _call(
                    lambda p=patch: firewalls.patch(  # type: ignore[misc]
                        project=ref.project, firewall=ref.firewall_name, firewall_resource=p
                    ),
                    f"patch {name}",
                )
            except (gexc.PreconditionFailed, gexc.Conflict):
                continue  # someone changed it since we read it: read again
            await asyncio.to_thread(operation.result, OPERATION_TIMEOUT_S)
            detail = "added " + ", ".join(added) if added else "target tags " + ", ".join(tags)
            log.info("firewall appended", rule=ref.firewall_name, added=",".join(added))
            return Step(name=name, status="updated", detail=detail)
        raise ApplicationError(f"{name}: kept changing under us; will retry")

    # -- identity -------------------------------------------------------------------------

    @activity.defn
    async def ensure_service_account(self, ref: ClusterRef) -> Step:
        email = ref.service_account_email
        name = f"service account {email}"
        iam = self.clients.iam
        try:
            await _call(
                lambda: iam.get_service_account(f"projects/{ref.project}/serviceAccounts/{email}"),
                name,
            )
            return Step(name=name, status="unchanged")
        except gexc.NotFound:
            pass
        try:
            await _call(
                lambda: iam.create_service_account(ref.project, SERVICE_ACCOUNT_ID, DISPLAY_NAME),
                f"create {name}",
            )
        except gexc.Conflict:
            return Step(name=name, status="unchanged")
        return Step(name=name, status="created")

    @activity.defn
    async def ensure_developer_binding(self, ref: ClusterRef) -> Step:
        member = f"serviceAccount:{ref.service_account_email}"
        name = f"IAM binding {DEVELOPER_ROLE}"
        resource = f"projects/{ref.project}"
        projects = self.clients.projects
        for _ in range(RACE_ATTEMPTS):
            policy = await _call(
                lambda: projects.get_iam_policy(resource=resource),
                f"IAM policy of {resource}",
                not_found="check --project",
            )
            binding = next((b for b in policy.bindings if b.role == DEVELOPER_ROLE), None)
            if binding is not None and member in binding.members:
                return Step(name=name, status="unchanged")
            if binding is None:
                policy.bindings.add(role=DEVELOPER_ROLE, members=[member])
            else:
                binding.members.append(member)
            try:
                await _call(
                    lambda p=policy: projects.set_iam_policy(  # type: ignore[misc]
                        request={"resource": resource, "policy": p}
                    ),
                    f"set IAM policy of {resource}",
                )
            except (gexc.Conflict, gexc.Aborted, gexc.PreconditionFailed):
                continue  # a concurrent change moved the etag: read, modify, write again
            return Step(name=name, status="created", detail=member)
        raise ApplicationError(f"{name}: the policy kept changing under us; will retry")

    @activity.defn
    async def ensure_key(self, input: KeyInput) -> Step:
        """A key written once to `key_file` (0600). A file whose key the account still lists is
        kept; a file whose key was deleted is replaced by a new one, and says so."""
        ref = input.cluster
        path = Path(os.path.expanduser(input.key_file))  # noqa: ASYNC240 - no I/O
        account = f"projects/{ref.project}/serviceAccounts/{ref.service_account_email}"
        name = f"key {path}"
        iam = self.clients.iam
        replaced = ""
        current = await asyncio.to_thread(_read_key, path)
        if current is not None:
            key_id, email = current
            if email != ref.service_account_email:
                raise ApplicationError(
                    f"{name} belongs to {email}, not {ref.service_account_email};"
                    " pass --key-file for this project's key",
                    non_retryable=True,
                )
            listed = await _call(
                lambda: iam.list_user_managed_keys(account), f"keys of {ref.service_account_email}"
            )
            if key_id in listed:
                await asyncio.to_thread(_ensure_private, path)
                return Step(name=name, status="unchanged", detail=f"key id {key_id[:8]}")
            replaced = f"its key {key_id[:8]} was deleted; "
        data = await _call(lambda: iam.create_key(account), f"create a key for {account}")
        try:
            key_id = str(json.loads(data)["private_key_id"])
        except (ValueError, KeyError, TypeError):
            raise ApplicationError(
                "the IAM API returned a key that is not a JSON key file", non_retryable=True
            ) from None
        await asyncio.to_thread(_write_key, path, data.decode())
        return Step(
            name=name,
            status="updated" if replaced else "created",
            detail=f"{replaced}key id {key_id[:8]}, mode 0600",
        )

    # -- the registry ---------------------------------------------------------------------

    @activity.defn
    async def ensure_repository(self, ref: ClusterRef) -> Step:
        registry = self.clients.registry
        name = f"Artifact Registry repository {REPOSITORY_ID} in {ref.region}"
        try:
            await _call(lambda: registry.get_repository(name=ref.repository_path), name)
            return Step(name=name, status="unchanged")
        except gexc.NotFound:
            pass
        repository = artifactregistry_v1.Repository(
            format_=artifactregistry_v1.Repository.Format.DOCKER,
            description="levers9 worker images, pulled by the GKE nodes",
        )

        def create() -> None:
            operation = registry.create_repository(
                parent=f"projects/{ref.project}/locations/{ref.region}",
                repository_id=REPOSITORY_ID,
                repository=repository,
            )
            operation.result(timeout=OPERATION_TIMEOUT_S)  # type: ignore[no-untyped-call]

        try:
            await _call(create, f"create {name}")
        except gexc.Conflict:
            return Step(name=name, status="unchanged")
        return Step(name=name, status="created")


def _read_key(path: Path) -> tuple[str, str] | None:
    """(key id, account email) of the key file, None when there is none."""
    if not path.exists():
        return None
    try:
        current = json.loads(path.read_text())
        return str(current["private_key_id"]), str(current["client_email"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApplicationError(
            f"key {path} is not a service-account key file ({type(exc).__name__});"
            " move it away and rerun",
            non_retryable=True,
        ) from None


def _write_key(path: Path, key_json: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(path, key_json)


def _ensure_private(path: Path) -> None:
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
