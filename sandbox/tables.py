"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

kubectl requests `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...` and prints the
columns the server sends; without them it can only show NAME and AGE. The columns and cell
texts follow the apiserver's printers (`pkg/printers/internalversion`) for the served types,
so `kubectl get nodes` shows `Ready,SchedulingDisabled` after a cordon and `kubectl get pods`
shows `Terminating`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from sandbox.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIG_MAPS,
    DAEMON_SETS,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    REPLICA_SETS,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    Resource,
)
from sandbox.subresources import selector_string

TABLE_MEDIA_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"

Column = tuple[str, str, int]  # name, type, priority (1 = shown with -o wide)
Row = Callable[[dict[str, Any], dt.datetime], list[Any]]

_NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)


def wants_table(accept: str) -> bool:
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))


def human_duration(seconds: float) -> str:
    """`duration.HumanDuration`: 45s, 3m20s, 5h, 3d4h, 2y ..."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _parse_time(text: Any) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.strptime(str(text)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _since(text: Any, now: dt.datetime) -> str:
    moment = _parse_time(text)
    return "<unknown>" if moment is None else human_duration((now - moment).total_seconds())


def _age(obj: dict[str, Any], now: dt.datetime) -> str:
    return _since(obj["metadata"].get("creationTimestamp"), now)


def _none(value: Any) -> Any:
    return "<none>" if value in (None, "", []) else value


def _containers(spec: dict[str, Any]) -> tuple[str, str]:
    containers = spec.get("containers") or []
    return (
        ",".join(str(c.get("name", "")) for c in containers),
        ",".join(str(c.get("image", "")) for c in containers),
    )


# -- printers ---------------------------------------------------------------------------------


def _pod_row(pod: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod["metadata"]
    reason = status.get("reason") or status.get("phase") or ""
    restarts, ready, last_restart = 0, 0, None
    for cs in reversed(status.get("containerStatuses") or []):
        restarts += int(cs.get("restartCount", 0))
        finished = _parse_time(
            ((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        )
        if finished and (last_restart is None or finished > last_restart):
            last_restart = finished
        state = cs.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            reason = term.get("reason") or (
                f"Signal:{term['signal']}"
                if term.get("signal")
                else f"ExitCode:{term.get('exitCode', 0)}"
            )
        elif "running" in state and cs.get("ready"):
            ready += 1
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    restarts_cell = str(restarts)
    if restarts and last_restart is not None:
        restarts_cell += f" ({human_duration((now - last_restart).total_seconds())} ago)"
    total = len(spec.get("containers") or [])
    gates = spec.get("readinessGates") or []
    return [
        meta["name"],
        f"{ready}/{total}",
        reason,
        restarts_cell,
        _age(pod, now),
        _none(status.get("podIP")),
        _none(spec.get("nodeName")),
        _none(status.get("nominatedNodeName")),
        "<none>" if not gates else f"0/{len(gates)}",
    ]


def _node_row(node: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status, meta = node.get("spec") or {}, node.get("status") or {}, node["metadata"]
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else "NotReady"
    if ready is not None and ready.get("status") == "True":
        state = "Ready"
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = meta.get("labels") or {}
    roles = sorted(
        {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")}
        | ({labels["kubernetes.io/role"]} if "kubernetes.io/role" in labels else set())
    )
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        meta["name"],
        state,
        ",".join(r for r in roles if r) or "<none>",
        _age(node, now),
        info.get("kubeletVersion", ""),
        _none(addresses.get("InternalIP")),
        _none(addresses.get("ExternalIP")),
        info.get("osImage", "<unknown>"),
        info.get("kernelVersion", "<unknown>"),
        info.get("containerRuntimeVersion", "<unknown>"),
    ]


def _deployment_row(d: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    names, images = _containers(((spec.get("template") or {}).get("spec")) or {})
    return [
        d["metadata"]["name"],
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        int(status.get("updatedReplicas", 0)),
        int(status.get("availableReplicas", 0)),
        _age(d, now),
        names,
        images,
        selector_string(spec.get("selector")) or "<none>",
    ]


def _replica_set_row(rs: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status = rs.get("spec") or {}, rs.get("status") or {}
    names, images = _containers(((spec.get("template") or {}).get("spec")) or {})
    return [
        rs["metadata"]["name"],
        int(spec.get("replicas", 0)),
        int(status.get("replicas", 0)),
        int(status.get("readyReplicas", 0)),
        _age(rs, now),
        names,
        images,
        selector_string(spec.get("selector")) or "<none>",
    ]


def _daemon_set_row(ds: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status = ds.get("spec") or {}, ds.get("status") or {}
    template_spec = ((spec.get("template") or {}).get("spec")) or {}
    names, images = _containers(template_spec)
    node_selector = ",".join(
        f"{k}={v}" for k, v in (template_spec.get("nodeSelector") or {}).items()
    )
    return [
        ds["metadata"]["name"],
        int(status.get("desiredNumberScheduled", 0)),
        int(status.get("currentNumberScheduled", 0)),
        int(status.get("numberReady", 0)),
        int(status.get("updatedNumberScheduled", 0)),
        int(status.get("numberAvailable", 0)),
        node_selector or "<none>",
        _age(ds, now),
        names,
        images,
        selector_string(spec.get("selector")) or "<none>",
    ]


def _job_status(job: dict[str, Any]) -> str:
    conditions = {
        c.get("type"): c.get("status") for c in (job.get("status") or {}).get("conditions") or []
    }
    for kind in ("Failed", "Complete", "Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if conditions.get(kind) == "True":
            return kind
    return "Terminating" if job["metadata"].get("deletionTimestamp") else "Running"


def _job_row(job: dict[str, Any], now: dt.datetime) -> list[Any]:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    succeeded = int(status.get("succeeded", 0))
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    else:
        parallelism = int(spec.get("parallelism", 0))
        completions = f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"
    start, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
    duration = "" if start is None else human_duration(((end or now) - start).total_seconds())
    names, images = _containers(((spec.get("template") or {}).get("spec")) or {})
    return [
        job["metadata"]["name"],
        _job_status(job),
        completions,
        duration,
        _age(job, now),
        names,
        images,
        selector_string(spec.get("selector")) or "<none>",
    ]


def _event_row(ev: dict[str, Any], now: dt.datetime) -> list[Any]:
    involved, source = ev.get("involvedObject") or {}, ev.get("source") or {}
    last = ev.get("lastTimestamp") or ev.get("eventTime") or ev["metadata"].get("creationTimestamp")
    first = ev.get("firstTimestamp") or ev.get("eventTime") or last
    origin = ",".join(p for p in (source.get("component"), source.get("host")) if p)
    return [
        _since(last, now),
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        str(ev.get("message", "")).strip(),
        involved.get("fieldPath", ""),
        origin or ev.get("reportingComponent", ""),
        _since(first, now),
        int(ev.get("count", 1) or 1),
        ev["metadata"]["name"],
    ]


def _binding_row(binding: dict[str, Any], now: dt.datetime) -> list[Any]:
    ref = binding.get("roleRef") or {}
    subjects = binding.get("subjects") or []

    def named(kind: str) -> str:
        return ", ".join(
            (
                f"{s.get('namespace', '')}/{s.get('name', '')}"
                if kind == "ServiceAccount"
                else s.get("name", "")
            )
            for s in subjects
            if s.get("kind") == kind
        )

    return [
        binding["metadata"]["name"],
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        _age(binding, now),
        named("User"),
        named("Group"),
        named("ServiceAccount"),
    ]


_ROLE_PRINTER: tuple[list[Column], Row] = (
    [("Name", "string", 0), ("Created At", "date", 0)],
    lambda o, now: [o["metadata"]["name"], o["metadata"].get("creationTimestamp", "")],
)
_BINDING_PRINTER: tuple[list[Column], Row] = (
    [
        ("Name", "string", 0),
        ("Role", "string", 0),
        ("Age", "string", 0),
        ("Users", "string", 1),
        ("Groups", "string", 1),
        ("ServiceAccounts", "string", 1),
    ],
    _binding_row,
)

_PRINTERS: dict[Resource, tuple[list[Column], Row]] = {
    ROLES: _ROLE_PRINTER,
    CLUSTER_ROLES: _ROLE_PRINTER,
    ROLE_BINDINGS: _BINDING_PRINTER,
    CLUSTER_ROLE_BINDINGS: _BINDING_PRINTER,
    SERVICE_ACCOUNTS: (
        [("Name", "string", 0), ("Secrets", "string", 0), ("Age", "string", 0)],
        lambda o, now: [o["metadata"]["name"], len(o.get("secrets") or []), _age(o, now)],
    ),
    PODS: (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        _pod_row,
    ),
    NODES: (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        _node_row,
    ),
    NAMESPACES: (
        [("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)],
        lambda o, now: [
            o["metadata"]["name"],
            (o.get("status") or {}).get("phase", ""),
            _age(o, now),
        ],
    ),
    DEPLOYMENTS: (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _deployment_row,
    ),
    REPLICA_SETS: (
        [
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _replica_set_row,
    ),
    DAEMON_SETS: (
        [
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Node Selector", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _daemon_set_row,
    ),
    JOBS: (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _job_row,
    ),
    SECRETS: (
        [("Name", "string", 0), ("Type", "string", 0), ("Data", "string", 0), ("Age", "string", 0)],
        lambda o, now: [
            o["metadata"]["name"],
            o.get("type", ""),
            len(o.get("data") or {}),
            _age(o, now),
        ],
    ),
    CONFIG_MAPS: (
        [("Name", "string", 0), ("Data", "string", 0), ("Age", "string", 0)],
        lambda o, now: [
            o["metadata"]["name"],
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            _age(o, now),
        ],
    ),
    EVENTS: (
        [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
            ("Subobject", "string", 1),
            ("Source", "string", 1),
            ("First Seen", "string", 1),
            ("Count", "string", 1),
            ("Name", "string", 1),
        ],
        _event_row,
    ),
    LEASES: (
        [("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)],
        lambda o, now: [
            o["metadata"]["name"],
            (o.get("spec") or {}).get("holderIdentity", ""),
            _age(o, now),
        ],
    ),
}
_DEFAULT: tuple[list[Column], Row] = (
    [("Name", "string", 0), ("Age", "string", 0)],
    lambda o, now: [o["metadata"]["name"], _age(o, now)],
)


def _column_definitions(columns: list[Column]) -> list[dict[str, Any]]:
    out = []
    for name, kind, priority in columns:
        column: dict[str, Any] = {
            "name": name,
            "type": kind,
            "format": "",
            "description": "",
            "priority": priority,
        }
        if name == "Name":
            column["format"], column["description"] = "name", _NAME_DESCRIPTION
        out.append(column)
    return out


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


def table(
    resource: Resource,
    objects: Iterable[dict[str, Any]],
    *,
    now: dt.datetime,
    include_object: str = "Metadata",
    list_meta: dict[str, Any] | None = None,
    headers: bool = True,
) -> dict[str, Any]:
    """A Table of `objects`; `include_object` is the request's `includeObject` (None,
    Metadata, Object)."""
    columns, row = _PRINTERS.get(resource, _DEFAULT)
    rows = []
    for obj in objects:
        entry: dict[str, Any] = {"cells": row(obj, now)[: len(columns)]}
        embedded = _row_object(obj, include_object)
        if embedded is not None:
            entry["object"] = embedded
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta or {},
        "columnDefinitions": _column_definitions(columns) if headers else None,
        "rows": rows,
    }
