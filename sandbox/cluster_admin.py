"""Scenario commands over HTTP, beside the admin API: nodes join, leave, go NotReady; images
appear in or vanish from the registries. `levers9 sandbox ...` and the tests call these.

| method and path | does |
| - | - |
| `GET /_sandbox/nodes` | the scenario's nodes as the cluster runs them |
| `POST /_sandbox/nodes` | add a node (a scenario `NodeSpec`, camelCase) |
| `DELETE /_sandbox/nodes/{name}` | the machine is gone |
| `PUT /_sandbox/nodes/{name}/ready` | `{"ready": false}` sets it NotReady, `true` Ready again |
| `POST /_sandbox/nodes/{name}/preempt` | `{"noticeSeconds": N}`: a spot VM's preemption |

A preemption is announced at once (the node tainted
`cloud.google.com/impending-node-termination`, as GKE does) and the machine is gone (its
processes killed, its Node deleted) N seconds later.
| `POST /_sandbox/images` | `{"image": ref}`: the registries now hold it |
| `DELETE /_sandbox/images` | `{"image": ref}`: they no longer do |
"""

from __future__ import annotations

from aiohttp import web

from sandbox import errors
from sandbox.admin import admin_only, read_json
from sandbox.cluster.cluster import Cluster
from sandbox.handlers import json_response
from sandbox.scenario import NodeSpec


class ClusterAdmin:
    """Routes bound before the app starts; the cluster is attached once it exists."""

    def __init__(self) -> None:
        self._cluster: Cluster | None = None

    def attach(self, cluster: Cluster) -> None:
        self._cluster = cluster

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise ValueError("the cluster is still starting")
        return self._cluster

    def add_routes(self, app: web.Application, admin_token: str) -> None:
        for method, path, handler in (
            ("GET", "/_sandbox/nodes", self._nodes),
            ("POST", "/_sandbox/nodes", self._add_node),
            ("DELETE", "/_sandbox/nodes/{name}", self._remove_node),
            ("PUT", "/_sandbox/nodes/{name}/ready", self._set_ready),
            ("POST", "/_sandbox/nodes/{name}/preempt", self._preempt),
            ("POST", "/_sandbox/images", self._add_image),
            ("DELETE", "/_sandbox/images", self._remove_image),
        ):
            app.router.add_route(method, path, admin_only(admin_token, handler))

    def _describe(self) -> web.Response:
        nodes = [spec.model_dump(mode="json", by_alias=True) for spec in self.cluster.node_specs()]
        return json_response({"nodes": nodes})

    async def _nodes(self, request: web.Request) -> web.Response:
        return self._describe()

    async def _add_node(self, request: web.Request) -> web.Response:
        await self.cluster.add_node(NodeSpec.model_validate(await read_json(request)))
        return self._describe()

    def _known(self, request: web.Request) -> str:
        name = request.match_info["name"]
        if name not in {spec.name for spec in self.cluster.node_specs()}:
            raise errors.ApiError(404, "NotFound", f'nodes "{name}" not found')
        return name

    async def _remove_node(self, request: web.Request) -> web.Response:
        await self.cluster.remove_node(self._known(request))
        return self._describe()

    async def _set_ready(self, request: web.Request) -> web.Response:
        name = self._known(request)
        body = await read_json(request)
        if not isinstance(body.get("ready"), bool):
            raise ValueError('expected {"ready": true|false}')
        await self.cluster.set_node_ready(name, body["ready"])
        return self._describe()

    async def _preempt(self, request: web.Request) -> web.Response:
        name = self._known(request)
        notice = (await read_json(request)).get("noticeSeconds")
        if (
            isinstance(notice, bool)
            or not isinstance(notice, int | float)
            or not 0 <= notice <= 3600
        ):
            raise ValueError('expected {"noticeSeconds": N}, N from 0 to 3600')
        self.cluster.preempt_node(name, float(notice))
        return self._describe()

    async def _add_image(self, request: web.Request) -> web.Response:
        self.cluster.add_image(str((await read_json(request))["image"]))
        return json_response({})

    async def _remove_image(self, request: web.Request) -> web.Response:
        self.cluster.remove_image(str((await read_json(request))["image"]))
        return json_response({})
