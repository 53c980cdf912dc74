"""REST handlers for resource requests: one method per Kubernetes verb, plus subresources.

Bodies are JSON (or YAML, which the apiserver also accepts); responses are JSON, or a
`meta.k8s.io/v1` Table when kubectl asks for one. Status codes follow the apiserver: 201 for
a create (and for an eviction, a binding or a service account's TokenRequest), 200
otherwise; a delete answers with the object where the type's registry returns it (pods,
namespaces, anything not gone yet) and a Success Status otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import yaml
from aiohttp import web

from sandbox import errors, protobuf, tables
from sandbox import options as request_options
from sandbox.continuation import parse_resource_version
from sandbox.options import DeleteOptions
from sandbox.patch import SUPPORTED_PATCH_TYPES, PatchType
from sandbox.podlogs import LogQuery
from sandbox.registry import Registry
from sandbox.resources import PODS, Resource
from sandbox.routing import RequestInfo
from sandbox.store import ListPage, dumps
from sandbox.subresources import binding_target, scale_of
from sandbox.watchstream import WatchRequest, WatchStreamer

JSON = "application/json"


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None, content_type: str = JSON
) -> web.Response:
    return web.Response(
        body=dumps(obj),
        status=status,
        headers={
            "Content-Type": content_type,
            "Cache-Control": "no-cache, private",
            **(headers or {}),
        },
    )


def error_response(error: errors.ApiError) -> web.Response:
    return json_response(error.status(), error.code, error.headers)


class ResourceHandlers:
    """Serves `/api/v1/...` and `/apis/<group>/<version>/...` resource paths."""

    def __init__(self, registry: Registry, watches: WatchStreamer) -> None:
        self._registry = registry
        self._watches = watches

    async def handle(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        resource = info.resource
        if resource is None:
            raise errors.path_not_found()
        if (
            info.namespace is not None
            and not resource.namespaced
            and info.resource_name != "namespaces"
        ):
            raise errors.path_not_found()
        _check_verb(resource, info)
        namespace = info.namespace if resource.namespaced else None
        if resource.namespaced and namespace is None and info.verb not in ("list", "watch"):
            raise errors.method_not_allowed()
        query = {k: v for k, v in request.query.items()}
        name = info.name or ""
        match info.verb:
            case "get":
                return await self._get(request, resource, namespace, name, info.subresource, query)
            case "list":
                return self._list(request, resource, namespace, query)
            case "watch":
                spec = WatchRequest(
                    resource,
                    namespace,
                    info.name,
                    query,
                    tables.wants_table(request.headers.get("Accept", "")),
                )
                return await self._watches.serve(request, spec)
            case "create":
                return await self._create(request, resource, namespace, info)
            case "update":
                dry_run = _dry_run(request, "UpdateOptions")
                body = await read_body(request)
                obj = self._registry.replace(
                    resource,
                    body,
                    namespace=namespace,
                    name=name,
                    subresource=info.subresource,
                    dry_run=dry_run,
                )
                return json_response(obj)
            case "patch":
                return await self._patch(request, resource, namespace, name, info.subresource)
            case "delete":
                return await self._delete(request, resource, namespace, name, query)
            case "deletecollection":
                return await self._delete_collection(request, resource, namespace, query)
        raise errors.method_not_allowed()

    # -- reads -------------------------------------------------------------------------------

    async def _get(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        name: str,
        subresource: str | None,
        query: dict[str, str],
    ) -> web.StreamResponse:
        if subresource == "log":
            return await self._log(request, namespace or "", name, query)
        obj = self._registry.get(resource, namespace, name)
        if subresource == "scale":
            return json_response(scale_of(obj))
        if subresource is None and tables.wants_table(request.headers.get("Accept", "")):
            table = tables.table(
                resource,
                [obj],
                now=self._now(),
                include_object=query.get("includeObject", "Metadata"),
                list_meta={"resourceVersion": obj["metadata"]["resourceVersion"]},
            )
            return json_response(table, content_type=tables.TABLE_MEDIA_TYPE)
        return json_response(obj)

    def _list(
        self, request: web.Request, resource: Resource, namespace: str | None, query: dict[str, str]
    ) -> web.Response:
        limit = _int_param(query, "limit", 0)
        continue_token = query.get("continue") or None
        requested = query.get("resourceVersion")
        if continue_token and requested not in (None, "", "0"):
            raise errors.bad_request(
                "specifying resource version is not allowed when using continue"
            )
        if requested not in (None, "", "0"):
            self._check_list_version(
                parse_resource_version(str(requested)), query.get("resourceVersionMatch")
            )
        page = self._registry.list(
            resource,
            namespace,
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
            limit=limit,
            continue_token=continue_token,
        )
        if tables.wants_table(request.headers.get("Accept", "")):
            table = tables.table(
                resource,
                page.items(),
                now=self._now(),
                include_object=query.get("includeObject", "Metadata"),
                list_meta=_list_meta(page),
            )
            return json_response(table, content_type=tables.TABLE_MEDIA_TYPE)
        head = dumps(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": _list_meta(page),
            }
        )
        body = head[:-1] + b',"items":[' + b",".join(page.raw_items) + b"]}"
        return web.Response(
            body=body, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"}
        )

    def _check_list_version(self, requested: int, match: str | None) -> None:
        current = self._registry.store.resource_version
        if match == "Exact" and requested != current:
            # Only the newest state is kept; an exact read of an older one is compacted away.
            raise errors.gone_too_old(requested, current)
        if requested > current:
            raise errors.ApiError(
                504,
                "Timeout",
                f"Too large resource version: {requested}, current: {current}",
                {
                    "causes": [
                        {
                            "reason": "ResourceVersionTooLarge",
                            "message": "Too large resource version",
                        }
                    ],
                    "retryAfterSeconds": 1,
                },
            )

    async def _log(
        self, request: web.Request, namespace: str, name: str, query: dict[str, str]
    ) -> web.StreamResponse:
        pod = self._registry.get(PODS, namespace, name)
        names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []]
        container = query.get("container") or (names[0] if len(names) == 1 else "")
        if not container:
            raise errors.bad_request(
                f"a container name must be specified for pod {name}, choose one of: "
                f"[{' '.join(names)}]"
            )
        if container not in names:
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        logs = self._registry.logs
        if not logs.has(namespace, name, container):
            phase = (pod.get("status") or {}).get("phase")
            if phase in (None, "Pending"):
                raise errors.bad_request(
                    f'container "{container}" in pod "{name}" is waiting to start: '
                    "ContainerCreating"
                )
        since_seconds = query.get("sinceSeconds")
        log_query = LogQuery(
            tail_lines=_int_param(query, "tailLines", None),
            since=(
                self._now() - dt.timedelta(seconds=int(since_seconds)) if since_seconds else None
            ),
            timestamps=query.get("timestamps", "").lower() == "true",
            limit_bytes=_int_param(query, "limitBytes", None),
        )
        headers = {"Content-Type": "text/plain", "Cache-Control": "no-cache, private"}
        if query.get("follow", "").lower() != "true":
            text = logs.read(namespace, name, container, log_query)
            return web.Response(body=text.encode(), headers=headers)
        response = web.StreamResponse(headers=headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        async for chunk in logs.follow(namespace, name, container, log_query):
            if chunk:
                await response.write(chunk.encode())
        await response.write_eof()
        return response

    # -- writes ------------------------------------------------------------------------------

    async def _create(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        info: RequestInfo,
    ) -> web.Response:
        dry_run = _dry_run(request, "CreateOptions")
        body = await read_body(request)
        if info.name is not None and info.subresource is None:
            raise errors.method_not_allowed()
        if info.subresource == "eviction":
            self._registry.evict(namespace or "", info.name or "", body)
            return json_response(errors.success_status(201), 201)
        if info.subresource == "binding":
            self._registry.bind(
                namespace or "", info.name or "", binding_target(body, info.name or "")
            )
            return json_response(errors.success_status(201), 201)
        if info.subresource == "token":
            answer = self._registry.service_accounts.token_request(
                namespace or "", info.name or "", body
            )
            return json_response(answer, 201)
        if info.subresource is not None:
            raise errors.method_not_allowed()
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not an object")
        obj = self._registry.create(resource, body, namespace=namespace, dry_run=dry_run)
        return json_response(obj, 201)

    async def _patch(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        name: str,
        subresource: str | None,
    ) -> web.Response:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            patch_type = PatchType(content_type)
        except ValueError:
            patch_type = None
        if patch_type is None or patch_type not in SUPPORTED_PATCH_TYPES:
            raise errors.unsupported_media_type(
                content_type, [str(t) for t in SUPPORTED_PATCH_TYPES]
            )
        raw = await request.read()
        dry_run = _dry_run(request, "PatchOptions")
        try:
            patch = json.loads(raw or b"null")
        except ValueError as error:
            raise errors.bad_request(f"error decoding patch: {error}") from None
        obj = self._registry.patch(
            resource,
            namespace,
            name,
            patch,
            patch_type,
            subresource=subresource,
            dry_run=dry_run,
        )
        return json_response(obj)

    async def _delete(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        name: str,
        query: dict[str, str],
    ) -> web.Response:
        options = DeleteOptions.from_body(
            await _optional_body(request), query, request.query.getall("dryRun", [])
        )
        outcome = self._registry.delete(resource, namespace, name, options)
        headers = {"Warning": f'299 - "{outcome.warnings[-1]}"'} if outcome.warnings else {}
        if outcome.finished and not resource.returns_deleted_object:
            meta = outcome.object["metadata"]
            details = {
                "name": name,
                **({"group": resource.group} if resource.group else {}),
                "kind": resource.plural,
                "uid": meta.get("uid"),
            }
            return json_response(errors.success_status(200, details), headers=headers)
        return json_response(outcome.object, headers=headers)

    async def _delete_collection(
        self, request: web.Request, resource: Resource, namespace: str | None, query: dict[str, str]
    ) -> web.Response:
        options = DeleteOptions.from_body(
            await _optional_body(request), query, request.query.getall("dryRun", [])
        )
        deleted = self._registry.delete_collection(
            resource,
            namespace,
            label_selector=query.get("labelSelector"),
            field_selector=query.get("fieldSelector"),
            options=options,
        )
        meta = {"resourceVersion": str(self._registry.store.resource_version)}
        return json_response(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": meta,
                "items": deleted,
            }
        )

    def _now(self) -> dt.datetime:
        return self._registry.store.now()


def _check_verb(resource: Resource, info: RequestInfo) -> None:
    """404 for a subresource the type lacks, 405 for a verb the path does not serve."""
    if info.subresource is None:
        allowed = set(resource.verbs)
        if info.name is not None:
            allowed -= {"list", "create", "deletecollection"}
        else:
            allowed -= {"get", "update", "patch", "delete"}
        if info.verb == "watch" or info.verb in allowed:
            return
        raise errors.method_not_allowed()
    sub = resource.subresource(info.subresource)
    if sub is None or info.name is None:
        raise errors.path_not_found()
    if info.verb not in sub.verbs:
        raise errors.method_not_allowed()


def _list_meta(page: ListPage) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
    if page.continue_token:
        meta["continue"] = page.continue_token
    if page.remaining is not None:
        meta["remainingItemCount"] = page.remaining
    return meta


def _int_param(query: dict[str, str], key: str, default: int | None) -> Any:
    value = query.get(key)
    if value in (None, ""):
        return default
    try:
        return int(str(value))
    except ValueError:
        raise errors.bad_request(f"invalid {key}: {value}") from None


def _dry_run(request: web.Request, options_kind: str) -> bool:
    return request_options.dry_run(request.query.getall("dryRun", []), options_kind)


async def read_body(request: web.Request) -> Any:
    """The request's object: JSON, YAML or protobuf (400 when it is none of them)."""
    raw = await request.read()
    if not raw:
        raise errors.bad_request("the body of the request is empty")
    content_type = request.headers.get("Content-Type", JSON).split(";")[0].strip()
    if content_type == protobuf.MEDIA_TYPE:
        return protobuf.decode_object(raw)
    try:
        if "yaml" in content_type:
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {error}") from None


async def _optional_body(request: web.Request) -> dict[str, Any] | None:
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise errors.bad_request(f"couldn't decode DeleteOptions: {error}") from None
    return body if isinstance(body, dict) else None
