"""The GKE cluster as `container.googleapis.com/v1` shows it: the sandbox's own cluster.

One cluster, the scenario's (`cluster.name` in `cluster.location`), answering under both path
forms (`projects/*/locations/*/clusters/*` and gcloud's older `projects/*/zones/*/clusters/*`;
`-` stands for any location). Its fields are read from the running sandbox at every call:

- `endpoint` is the sandbox's Kubernetes API (`127.0.0.1:<port>`; GKE gives an address only
  and serves on 443), `masterAuth.clusterCaCertificate` the sandbox CA, base64 of the PEM;
- `masterAuthorizedNetworksConfig` (and the same under
  `controlPlaneEndpointsConfig.ipEndpointsConfig.authorizedNetworksConfig`) is the sandbox's
  `AccessPolicy.authorized_networks`; UpdateCluster with
  `update.desiredMasterAuthorizedNetworksConfig` writes it there, so the Kubernetes API admits
  or refuses callers accordingly from the next request on;
- `nodePools` are the nodes' `cloud.google.com/gke-nodepool` labels, with `config.tags`
  `gke-<cluster>-<hash>-node`, the tag GKE puts on every node of the cluster (what a firewall
  rule to the nodes targets).

UpdateCluster is done when it answers: its Operation has `status: DONE`. `etag` is a digest
of what an update can change; an update carrying an older one is refused (409 ABORTED).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandbox.access import AccessPolicy
from sandbox.gcp import errors
from sandbox.gcp.calls import Call, Json, Route, rfc3339
from sandbox.gcp.world import GcpWorld
from sandbox.scenario import ClusterInfo, NodeSpec

SERVICE = "container.googleapis.com"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
DEFAULT_POOL = "default-pool"
_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
_SUPPORTED_UPDATES = frozenset(
    {"desiredMasterAuthorizedNetworksConfig", "desiredControlPlaneEndpointsConfig", "etag"}
)


@dataclass(frozen=True)
class ClusterSite:
    """What the cluster's description is read from.

    Attributes:
        info: the scenario's cluster (name, project, location, version).
        endpoint: `127.0.0.1:<port>` of the sandbox's Kubernetes API.
        ca_base64: the sandbox CA as GKE reports it.
        node_specs: the nodes as they are now (scenario commands add and remove them).
    """

    info: ClusterInfo
    endpoint: str
    ca_base64: str
    node_specs: Callable[[], Sequence[NodeSpec]]


def network_tag(cluster: str, pool: str = "") -> str:
    """The network tag GKE gives every node of a cluster, whatever its node pool
    (`gke-<cluster>-<hash>-node`): what a firewall rule to the nodes targets."""
    digest = hashlib.sha256(cluster.encode()).hexdigest()[:8]
    return f"gke-{cluster}-{digest}-node"


class Container:
    """The cluster's description, UpdateCluster (authorized networks), and its operations."""

    def __init__(
        self,
        world: GcpWorld,
        access: AccessPolicy,
        site: ClusterSite,
        persist: Callable[[], None],
        started: str,
    ) -> None:
        self._world = world
        self._access = access
        self._site = site
        self._persist = persist
        self._started = started

    @property
    def _version(self) -> str:
        return self._site.info.kubelet_version.removeprefix("v")

    def restore(self) -> None:
        """Applies the authorized networks an UpdateCluster set before a restart."""
        if self._world.api_networks_set:
            self._access.set_authorized_networks(self._world.api_networks)

    # -- the resources -----------------------------------------------------------------------

    def authorized_networks(self) -> Json:
        networks = self._access.authorized_networks
        if networks is None:
            return {"enabled": False}
        blocks = []
        for network in networks:
            block = {"cidrBlock": str(network)}
            name = self._world.network_names.get(str(network), "")
            if name:
                block["displayName"] = name
            blocks.append(block)
        return {"enabled": True, "cidrBlocks": blocks}

    def cluster(self, base_url: str) -> Json:
        info = self._site.info
        networks = self.authorized_networks()
        pools = self.node_pools(base_url)
        body: Json = {
            "name": info.name,
            "description": "The levers9 sandbox's cluster.",
            "nodePools": pools,
            "locations": [info.location],
            "network": "default",
            "subnetwork": "default",
            "clusterIpv4Cidr": "10.4.0.0/14",
            "servicesIpv4Cidr": "10.8.0.0/20",
            "masterAuth": {"clusterCaCertificate": self._site.ca_base64},
            "masterAuthorizedNetworksConfig": networks,
            "controlPlaneEndpointsConfig": {
                "ipEndpointsConfig": {
                    "enabled": True,
                    "enablePublicEndpoint": True,
                    "publicEndpoint": self._site.endpoint,
                    "authorizedNetworksConfig": networks,
                }
            },
            "networkConfig": {
                "network": f"projects/{info.project}/global/networks/default",
                "subnetwork": f"projects/{info.project}/regions/{self._region}/subnetworks/default",
            },
            "selfLink": self._link(base_url, "clusters", info.name),
            "zone": info.location,
            "endpoint": self._site.endpoint,
            "initialClusterVersion": self._version,
            "currentMasterVersion": self._version,
            "currentNodeVersion": self._version,
            "createTime": self._started,
            "status": "RUNNING",
            "currentNodeCount": sum(p["initialNodeCount"] for p in pools),
            "location": info.location,
            "id": hashlib.sha256(info.name.encode()).hexdigest()[:32],
        }
        body["etag"] = self._etag(networks, pools)
        return body

    def node_pools(self, base_url: str) -> list[Json]:
        pools: dict[str, list[NodeSpec]] = {}
        for spec in self._site.node_specs():
            pools.setdefault(spec.labels.get(NODE_POOL_LABEL, DEFAULT_POOL), []).append(spec)
        return [self._node_pool(base_url, name, specs) for name, specs in pools.items()]

    def _node_pool(self, base_url: str, name: str, specs: list[NodeSpec]) -> Json:
        first = specs[0]
        config: Json = {
            "machineType": first.labels.get("node.kubernetes.io/instance-type", "e2-standard-8"),
            "diskSizeGb": 100,
            "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "serviceAccount": "default",
            "imageType": "COS_CONTAINERD",
            "tags": [network_tag(self._site.info.name, name)],
        }
        accelerator = first.labels.get("cloud.google.com/gke-accelerator")
        if accelerator and first.gpus.count:
            config["accelerators"] = [
                {"acceleratorCount": str(first.gpus.count), "acceleratorType": accelerator}
            ]
        taints = [
            {"key": t.key, "value": t.value, "effect": _EFFECTS.get(t.effect, "NO_EXECUTE")}
            for t in first.taints
        ]
        if taints:
            config["taints"] = taints
        return {
            "name": name,
            "config": config,
            "initialNodeCount": len(specs),
            "locations": [self._site.info.location],
            "selfLink": self._link(base_url, "clusters", self._site.info.name)
            + f"/nodePools/{name}",
            "version": self._version,
            "status": "RUNNING",
            "management": {"autoUpgrade": True, "autoRepair": True},
        }

    @property
    def _region(self) -> str:
        location = self._site.info.location
        return location.rsplit("-", 1)[0] if location.count("-") == 2 else location

    def _link(self, base_url: str, kind: str, name: str) -> str:
        info = self._site.info
        return f"{base_url}/v1/projects/{info.project}/zones/{info.location}/{kind}/{name}"

    @staticmethod
    def _etag(networks: Json, pools: list[Json]) -> str:
        state = json.dumps([networks, [p["name"] for p in pools]], sort_keys=True)
        return base64.b64encode(hashlib.sha256(state.encode()).digest()[:12]).decode()

    # -- the API -----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        scope = "/v1/projects/{project}/{scope:locations|zones}/{location}"
        cluster = scope + "/clusters/{cluster}"
        get, update = "container.clusters.get", "container.clusters.update"
        return [
            Route("GET", scope + "/clusters", "container.clusters.list", self._list, SERVICE),
            Route("GET", cluster, get, self._get, SERVICE),
            Route("PUT", cluster, update, self._update, SERVICE),
            Route("GET", cluster + "/nodePools", get, self._list_pools, SERVICE),
            Route("GET", cluster + "/nodePools/{pool}", get, self._get_pool, SERVICE),
            # The `locations` form of this path is shared with Artifact Registry (server.py).
            Route(
                "GET",
                "/v1/projects/{project}/zones/{location}/operations/{operation}",
                "container.operations.get",
                self.get_operation,
                SERVICE,
            ),
        ]

    def _check_location(self, call: Call) -> None:
        if call.params["location"] not in ("-", self._site.info.location):
            raise errors.not_found(
                f"Not found: projects/{call.params['project']}/locations/"
                f"{call.params['location']}/clusters/{call.params.get('cluster', '')}."
            )

    def _check_cluster(self, call: Call) -> None:
        self._check_location(call)
        if call.params["cluster"] != self._site.info.name:
            raise errors.not_found(
                f"Not found: projects/{call.params['project']}/{call.params['scope']}/"
                f"{call.params['location']}/clusters/{call.params['cluster']}.\n"
                f"Could not find [{call.params['cluster']}] in [{call.params['location']}]."
            )

    def _list(self, call: Call) -> Json:
        if call.params["location"] not in ("-", self._site.info.location):
            return {"clusters": []}
        return {"clusters": [self.cluster(call.base_url)]}

    def _get(self, call: Call) -> Json:
        self._check_cluster(call)
        return self.cluster(call.base_url)

    def _list_pools(self, call: Call) -> Json:
        self._check_cluster(call)
        return {"nodePools": self.node_pools(call.base_url)}

    def _get_pool(self, call: Call) -> Json:
        self._check_cluster(call)
        for pool in self.node_pools(call.base_url):
            if pool["name"] == call.params["pool"]:
                return pool
        raise errors.not_found(
            f"Not found: projects/{call.params['project']}/locations/{call.params['location']}"
            f"/clusters/{call.params['cluster']}/nodePools/{call.params['pool']}."
        )

    def _update(self, call: Call) -> Json:
        self._check_cluster(call)
        update = call.body.get("update")
        if not isinstance(update, dict) or not update:
            raise errors.invalid_argument("update: must not be empty.")
        unsupported = sorted(set(update) - _SUPPORTED_UPDATES)
        if unsupported:
            raise errors.GoogleApiError(
                400,
                f"The sandbox's cluster cannot change {', '.join(unsupported)}; only "
                "desiredMasterAuthorizedNetworksConfig is emulated.",
            )
        etag = update.get("etag")
        if etag and etag != self.cluster(call.base_url)["etag"]:
            raise errors.aborted(
                "Cluster is being updated concurrently (etag mismatch); get it again and retry."
            )
        config = update.get("desiredMasterAuthorizedNetworksConfig")
        if config is None:
            endpoints = update.get("desiredControlPlaneEndpointsConfig") or {}
            config = (endpoints.get("ipEndpointsConfig") or {}).get("authorizedNetworksConfig")
        if isinstance(config, dict):
            self._set_networks(config)
        return self._operation(call, "UPDATE_CLUSTER")

    def _set_networks(self, config: Json) -> None:
        names: dict[str, str] = {}
        for block in config.get("cidrBlocks") or []:
            cidr = str(block.get("cidrBlock", ""))
            try:
                network = str(ipaddress.ip_network(cidr, strict=False))
            except ValueError:
                raise errors.invalid_argument(f"Invalid CIDR block: {cidr!r}.") from None
            names[network] = str(block.get("displayName", ""))
        networks = list(names) if config.get("enabled") else None
        self._access.set_authorized_networks(networks)
        self._world.api_networks = networks
        self._world.api_networks_set = True
        self._world.network_names = {c: n for c, n in names.items() if n}
        self._persist()

    def _operation(self, call: Call, kind: str) -> Json:
        info = self._site.info
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(4)}"
        now = rfc3339()
        body: Json = {
            "name": name,
            "zone": info.location,
            "operationType": kind,
            "status": "DONE",
            "selfLink": self._link(call.base_url, "operations", name),
            "targetLink": self._link(call.base_url, "clusters", info.name),
            "startTime": now,
            "endTime": now,
            "location": info.location,
        }
        key = f"projects/{info.project}/locations/{info.location}/operations/{name}"
        self._world.operations[key] = ("container", body)
        return body

    def get_operation(self, call: Call) -> Json:
        info = self._site.info
        key = f"projects/{info.project}/locations/{info.location}/operations/"
        found = self._world.operation(key + call.params["operation"])
        if found is None or found[0] != "container":
            raise errors.not_found(f"Operation {call.params['operation']} not found.")
        return found[1]
