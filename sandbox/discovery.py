"""Discovery documents: `/version`, `/api`, `/apis`, per-group and per-version resource lists,
the aggregated discovery kubectl 1.27+ asks for first, and a minimal OpenAPI v3.

kubectl builds its REST mapping from these (short names such as `po` and `deploy`, which
subresources exist: `kubectl drain` looks for `pods/eviction` served as policy/v1 Eviction,
`kubectl scale` for `deployments/scale` as autoscaling/v1 Scale). The OpenAPI v3 documents
carry only what kubectl reads before a create or apply: each type's PATCH operation with its
`x-kubernetes-group-version-kind` and the `fieldValidation` parameter, which tells kubectl the
server validates fields itself. No schemas are published, so `kubectl explain` has nothing to
show and `kubectl apply` computes its patches from its built-in types, as it does for a
server without OpenAPI.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sandbox.resources import Resource, ResourceCatalog

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


@dataclass(frozen=True)
class ServerVersion:
    """What `/version` reports; kubectl's gcloud dispatcher picks its kubectl by the minor."""

    major: int = 1
    minor: int = 32
    patch: int = 4
    gke_build: str = "gke.1415000"

    @property
    def git_version(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}-{self.gke_build}"

    def document(self) -> dict[str, Any]:
        return {
            "major": str(self.major),
            "minor": str(self.minor),
            "gitVersion": self.git_version,
            "gitCommit": hashlib.sha1(self.git_version.encode()).hexdigest(),
            "gitTreeState": "clean",
            "buildDate": "2025-04-02T09:12:31Z",
            "goVersion": "go1.23.6 X:boringcrypto",
            "compiler": "gc",
            "platform": "linux/amd64",
        }


def wants_aggregated(accept: str) -> str | None:
    """The aggregated discovery media type to answer with, if the client asked for one."""
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")}
        if "g=apidiscovery.k8s.io" in params and "as=APIGroupDiscoveryList" in params:
            if "v=v2" in params:
                return AGGREGATED_V2
            if "v=v2beta1" in params:
                return AGGREGATED_V2BETA1
    return None


class Discovery:
    """Builds the discovery documents for a catalog once; they never change at runtime."""

    def __init__(self, catalog: ResourceCatalog, server_address: str) -> None:
        self._catalog = catalog
        self._address = server_address

    def api_versions(self) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self._address}
            ],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self._catalog.group_versions().get(group)
        if not group or versions is None:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(g) for g in self._catalog.group_versions() if g]
        for group in groups:
            assert group is not None
            del group["kind"], group["apiVersion"]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        resources = self._catalog.in_group_version(group, version)
        if not resources:
            return None
        out: list[dict[str, Any]] = []
        for r in resources:
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            if r.categories:
                entry["categories"] = list(r.categories)
            entry["storageVersionHash"] = r.storage_version_hash
            out.append(entry)
            for sub in r.subresources:
                sub_entry: dict[str, Any] = {
                    "name": f"{r.plural}/{sub.name}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                }
                if sub.group is not None:
                    sub_entry["group"] = sub.group
                    sub_entry["version"] = sub.version
                sub_entry["kind"] = sub.kind
                sub_entry["verbs"] = list(sub.verbs)
                out.append(sub_entry)
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": out,
        }

    def aggregated(self, legacy: bool, media_type: str) -> dict[str, Any]:
        """`/api` (legacy=True) or `/apis` as an APIGroupDiscoveryList."""
        api_version = media_type.split("v=")[1].split(";")[0]
        items = []
        for group, versions in self._catalog.group_versions().items():
            if (group == "") != legacy:
                continue
            item: dict[str, Any] = {"metadata": {"creationTimestamp": None}}
            if group:
                item["metadata"]["name"] = group
            item["versions"] = [
                {
                    "version": v,
                    "resources": [
                        self._aggregated_resource(r)
                        for r in self._catalog.in_group_version(group, v)
                    ],
                    "freshness": "Current",
                }
                for v in versions
            ]
            items.append(item)
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": f"apidiscovery.k8s.io/{api_version}",
            "metadata": {},
            "items": items,
        }

    @staticmethod
    def _aggregated_resource(r: Resource) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "resource": r.plural,
            "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
            "scope": "Namespaced" if r.namespaced else "Cluster",
            "singularResource": r.singular,
            "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        if r.subresources:
            entry["subresources"] = [
                {
                    "subresource": s.name,
                    "responseKind": {
                        "group": s.group if s.group is not None else r.group,
                        "version": s.version or r.version,
                        "kind": s.kind,
                    },
                    "verbs": list(s.verbs),
                }
                for s in r.subresources
            ]
        return entry

    # -- OpenAPI v3 --------------------------------------------------------------------------

    def openapi_root(self) -> dict[str, Any]:
        paths = {}
        for group, versions in self._catalog.group_versions().items():
            for version in versions:
                key = f"apis/{group}/{version}" if group else f"api/{version}"
                digest = (
                    hashlib.sha512(
                        json.dumps(
                            self.openapi_group_version(group, version), sort_keys=True
                        ).encode()
                    )
                    .hexdigest()[:32]
                    .upper()
                )
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return {"paths": paths}

    def openapi_group_version(self, group: str, version: str) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        for r in self._catalog.in_group_version(group, version):
            prefix = r.path_prefix + ("/namespaces/{namespace}" if r.namespaced else "")
            gvk = {"group": r.group, "version": r.version, "kind": r.kind}
            paths[f"{prefix}/{r.plural}/{{name}}"] = {
                "patch": {
                    "operationId": f"patch{r.kind}",
                    "parameters": [
                        {
                            "name": "fieldValidation",
                            "in": "query",
                            "schema": {"type": "string", "uniqueItems": True},
                        },
                        {
                            "name": "fieldManager",
                            "in": "query",
                            "schema": {"type": "string", "uniqueItems": True},
                        },
                    ],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                }
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths,
            "components": {"schemas": {}},
        }

    def has_group_version(self, group: str, version: str) -> bool:
        return bool(self._catalog.in_group_version(group, version))
