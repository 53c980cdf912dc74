"""What a process container sees: its environment and its volumes, built as the kubelet does.

Environment, lowest precedence first: the kubelet's service variables
(`KUBERNETES_SERVICE_HOST`/`PORT` when the sandbox API's address is known), `HOSTNAME`, the
sandbox contract below, `envFrom` (ConfigMaps and Secrets, with `prefix`), `env` (with
`$(VAR)` expansion against what precedes it, and `valueFrom`: downward-API `fieldRef`,
`resourceFieldRef`, `configMapKeyRef`, `secretKeyRef`), then the device plugin's variables.
A missing Secret or ConfigMap (not `optional`) is the kubelet's `CreateContainerConfigError`
with its message, retried.

The sandbox contract (a process has no container filesystem, so paths are mapped):

- `LEVERS9_SANDBOX_ROOT=<state_dir>/nodes/<node>`: the node's filesystem root. A hostPath
  volume `/var/lib/x` is the directory `$LEVERS9_SANDBOX_ROOT/var/lib/x`; the kubelet's own
  files live there too (`var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`).
- `LEVERS9_SANDBOX_MOUNTS`: a JSON object `{"<mountPath>": "<host directory or file>"}` for
  every volume mount of the container (hostPath, emptyDir, secret, configMap, projected;
  `subPath` applied). A process maps a container path by its longest matching mountPath.
  The service-account token volume admission adds (`serviceaccounts`) is a projected volume
  at `/var/run/secrets/kubernetes.io/serviceaccount` holding `token` (a JWT bound to the pod,
  fetched from the API at each container start), `ca.crt` (the API's CA) and `namespace`: with
  `KUBERNETES_SERVICE_HOST`/`PORT`, what `kubernetes.config.load_incluster_config` reads, once
  its two file names are mapped.
- `PATH` (unless the pod sets one): the directory of the sandbox's Python interpreter first,
  so `python` and the project's console scripts (`levers9-worker`) resolve, then the usual
  system directories. `HOME` is the container's scratch directory (also its working
  directory unless `workingDir` lies inside a mount).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from levers9.core.quantity import parse_quantity
from sandbox import errors
from sandbox.cluster.requests import allocatable, container_requests
from sandbox.resources import CONFIG_MAPS, SECRETS

if TYPE_CHECKING:
    from sandbox.registry import Registry

ROOT_ENV = "LEVERS9_SANDBOX_ROOT"
MOUNTS_ENV = "LEVERS9_SANDBOX_MOUNTS"
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """`CreateContainerConfigError`: the container cannot be configured (yet)."""


class MountError(Exception):
    """`FailedMount`: a volume cannot be set up (yet)."""


@dataclass(frozen=True)
class PodContext:
    """What the environment and the volumes are built from."""

    registry: Registry
    pod: dict[str, Any]
    node: dict[str, Any]
    node_root: Path
    pod_dir: Path
    api_address: tuple[str, int] | None = None


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: known names are replaced, `$$` escapes a `$`,
    anything else stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(
    ctx: PodContext, container: Mapping[str, Any], mounts: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment (see module doc); raises ConfigError."""
    meta = ctx.pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    env: dict[str, str] = {}
    if ctx.api_address is not None:
        api_host, port = ctx.api_address
        env.update(
            {
                "KUBERNETES_SERVICE_HOST": api_host,
                "KUBERNETES_SERVICE_PORT": str(port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
                "KUBERNETES_PORT": f"tcp://{api_host}:{port}",
            }
        )
    spec = ctx.pod.get("spec") or {}
    # A pod on the host network sees the node's hostname, as in a real container.
    node_name = (ctx.node.get("metadata") or {}).get("name") if spec.get("hostNetwork") else None
    env["HOSTNAME"] = str(node_name or spec.get("hostname") or meta.get("name", ""))
    env[ROOT_ENV] = str(ctx.node_root)
    env[MOUNTS_ENV] = json.dumps(dict(mounts), separators=(",", ":"))
    for source in container.get("envFrom") or ():
        env.update(_env_from(ctx, namespace, source))
    for var in container.get("env") or ():
        name = str(var.get("name", ""))
        if "valueFrom" in var:
            value = _value_from(ctx, namespace, container, var["valueFrom"])
            if value is None:
                continue
            env[name] = value
        else:
            env[name] = expand(str(var.get("value", "")), env)
    env.setdefault("PATH", f"{Path(sys.executable).parent}:{_SYSTEM_PATH}")
    return env


def _env_from(ctx: PodContext, namespace: str, source: Mapping[str, Any]) -> dict[str, str]:
    prefix = str(source.get("prefix") or "")
    for key, resource, label in (
        ("configMapRef", CONFIG_MAPS, "configmap"),
        ("secretRef", SECRETS, "secret"),
    ):
        ref = source.get(key)
        if ref is None:
            continue
        data = _read_data(
            ctx, resource, namespace, str(ref.get("name", "")), label, bool(ref.get("optional"))
        )
        return {f"{prefix}{k}": v for k, v in (data or {}).items()}
    return {}


def _read_data(
    ctx: PodContext, resource: Any, namespace: str, name: str, label: str, optional: bool
) -> dict[str, str] | None:
    obj = ctx.registry.find(resource, namespace, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{label} "{name}" not found')
    if resource is SECRETS:
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    return {k: str(v) for k, v in (obj.get("data") or {}).items()}


def _value_from(
    ctx: PodContext, namespace: str, container: Mapping[str, Any], source: Mapping[str, Any]
) -> str | None:
    if "fieldRef" in source:
        return field_value(ctx.pod, str(source["fieldRef"].get("fieldPath", "")))
    if "resourceFieldRef" in source:
        return _resource_value(ctx, container, source["resourceFieldRef"])
    for key, resource, label, kind in (
        ("secretKeyRef", SECRETS, "secret", "Secret"),
        ("configMapKeyRef", CONFIG_MAPS, "configmap", "ConfigMap"),
    ):
        ref = source.get(key)
        if ref is None:
            continue
        name, wanted = str(ref.get("name", "")), str(ref.get("key", ""))
        optional = bool(ref.get("optional"))
        data = _read_data(ctx, resource, namespace, name, label, optional)
        if data is None:
            return None
        if wanted not in data:
            if optional:
                return None
            raise ConfigError(f"couldn't find key {wanted} in {kind} {namespace}/{name}")
        return data[wanted]
    return None


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API `fieldRef` value."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    match = _LABEL_REF.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i.get("ip", "") for i in status.get("hostIPs") or ()),
        "status.podIPs": ",".join(i.get("ip", "") for i in status.get("podIPs") or ()),
    }
    value = simple.get(path)
    return "" if value is None else str(value)


def _resource_value(ctx: PodContext, container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    amounts = container_requests(container)
    limits = (container.get("resources") or {}).get("limits") or {}
    if kind == "limits" and name not in limits:
        value = allocatable(ctx.node).get(name, Fraction(0))  # unset limit: node allocatable
    elif kind == "limits":
        value = parse_quantity(limits[name])
    else:
        value = amounts.get(name, Fraction(0))
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(value / divisor)) if divisor else "0"


def volume_mounts(ctx: PodContext, container: Mapping[str, Any]) -> dict[str, str]:
    """Sets up the container's volumes; returns mountPath → host path. Raises MountError."""
    volumes = {v.get("name"): v for v in (ctx.pod.get("spec") or {}).get("volumes") or ()}
    out: dict[str, str] = {}
    for mount in container.get("volumeMounts") or ():
        volume = volumes.get(mount.get("name"))
        if volume is None:
            continue
        host = _volume_dir(ctx, volume)
        if host is None:
            continue  # a volume type the sandbox does not emulate: not mounted
        sub = str(mount.get("subPath") or "")
        out[str(mount.get("mountPath", ""))] = str(inside(host, sub) if sub else host)
    return out


def inside(root: Path, relative: str) -> Path:
    """`root/relative` with `..` resolved, refusing a path that leaves `root`: a pod must not
    reach outside its node's directory through a hostPath, subPath or projected key."""
    target = Path(os.path.normpath(root / relative.lstrip("/")))
    if target != root and root not in target.parents:
        raise MountError(f"path {relative!r} leaves the volume")
    return target


def _volume_dir(ctx: PodContext, volume: Mapping[str, Any]) -> Path | None:
    name = str(volume.get("name", ""))
    if "hostPath" in volume:
        return _host_path(ctx, name, volume["hostPath"])
    volumes_dir = ctx.pod_dir / "volumes"
    if "emptyDir" in volume:
        path = volumes_dir / "kubernetes.io~empty-dir" / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    if "projected" in volume:
        path = volumes_dir / "kubernetes.io~projected" / name
        _write_files(path, _projected_files(ctx, name, volume["projected"]))
        return path
    for key, resource, label, plugin in (
        ("secret", SECRETS, "secret", "kubernetes.io~secret"),
        ("configMap", CONFIG_MAPS, "configmap", "kubernetes.io~configmap"),
    ):
        source = volume.get(key)
        if source is None:
            continue
        ref = str(source.get("secretName") or source.get("name") or "")
        namespace = str((ctx.pod.get("metadata") or {}).get("namespace", ""))
        try:
            data = _read_data(ctx, resource, namespace, ref, label, bool(source.get("optional")))
        except ConfigError as error:
            raise MountError(f'MountVolume.SetUp failed for volume "{name}" : {error}') from None
        path = volumes_dir / plugin / name
        _project(path, data or {}, source.get("items"), source.get("defaultMode"))
        return path
    return None


def _host_path(ctx: PodContext, name: str, source: Mapping[str, Any]) -> Path:
    target = inside(ctx.node_root, str(source.get("path", "/")))
    kind = str(source.get("type") or "")
    if kind in ("", "DirectoryOrCreate"):
        # An untyped hostPath that is missing is created by the runtime, as containerd does.
        if not target.exists():
            target.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    elif kind == "Directory" and not target.is_dir():
        raise MountError(
            f'MountVolume.SetUp failed for volume "{name}" : hostPath type check failed: '
            f"{source.get('path')} is not a directory"
        )
    elif kind == "File" and not target.is_file():
        raise MountError(
            f'MountVolume.SetUp failed for volume "{name}" : hostPath type check failed: '
            f"{source.get('path')} is not a file"
        )
    return target


_File = tuple[str, str, Any]  # path in the volume, content, mode (None: the default)


def _selected(data: Mapping[str, str], items: Any) -> list[_File]:
    """The files a Secret's or ConfigMap's keys make: `items` (key, path, mode), or every key."""
    wanted = {str(i.get("key")): i for i in items or ()} or {k: {"path": k} for k in data}
    return [
        (str(item.get("path", key)), data[key], item.get("mode"))
        for key, item in wanted.items()
        if key in data
    ]


def _write_files(path: Path, files: list[_File], mode: Any = None) -> None:
    """Writes the volume's files, with the kubelet's default mode 0644 or the volume's
    `defaultMode` (a file's own `mode` wins)."""
    path.mkdir(parents=True, exist_ok=True)
    for relative, text, own in files:
        target = inside(path, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        chosen = own if own is not None else mode
        target.chmod(int(chosen) if isinstance(chosen, int) else 0o644)


def _project(path: Path, data: Mapping[str, str], items: Any, mode: Any = None) -> None:
    _write_files(path, _selected(data, items), mode)


def _projected_files(ctx: PodContext, name: str, source: Mapping[str, Any]) -> list[_File]:
    """A projected volume's files: service-account tokens, Secret and ConfigMap keys and
    downward-API fields, in the order of `sources` (raises MountError)."""
    namespace = str((ctx.pod.get("metadata") or {}).get("namespace", ""))
    failed = f'MountVolume.SetUp failed for volume "{name}" :'
    files: list[_File] = []
    for projection in source.get("sources") or ():
        token = projection.get("serviceAccountToken")
        if token is not None:
            try:
                text = ctx.registry.service_accounts.pod_token(
                    ctx.pod,
                    audience=token.get("audience") or None,
                    expiration_seconds=int(token.get("expirationSeconds") or 3600),
                )
            except errors.ApiError as error:
                raise MountError(f"{failed} failed to fetch token: {error.message}") from None
            files.append((str(token.get("path") or "token"), text, None))
        for key, resource, label in (
            ("secret", SECRETS, "secret"),
            ("configMap", CONFIG_MAPS, "configmap"),
        ):
            ref = projection.get(key)
            if ref is None:
                continue
            try:
                data = _read_data(
                    ctx,
                    resource,
                    namespace,
                    str(ref.get("name", "")),
                    label,
                    bool(ref.get("optional")),
                )
            except ConfigError as error:
                raise MountError(f"{failed} {error}") from None
            files.extend(_selected(data or {}, ref.get("items")))
        downward = projection.get("downwardAPI")
        if downward is not None:
            for item in downward.get("items") or ():
                field = (item.get("fieldRef") or {}).get("fieldPath")
                if field:
                    files.append(
                        (
                            str(item.get("path", "")),
                            field_value(ctx.pod, str(field)),
                            item.get("mode"),
                        )
                    )
    if source.get("defaultMode") is not None:
        files = [(p, t, m if m is not None else source["defaultMode"]) for p, t, m in files]
    return files


def working_dir(container: Mapping[str, Any], mounts: Mapping[str, str], scratch: Path) -> Path:
    """`workingDir` mapped through the mounts; the container's scratch directory otherwise."""
    wanted = str(container.get("workingDir") or "")
    best = ""
    for mount_path in mounts:
        prefix = mount_path.rstrip("/")
        if (wanted == prefix or wanted.startswith(prefix + "/")) and len(prefix) > len(best):
            best = prefix
    if not best:
        return scratch
    target = inside(Path(mounts[best]), wanted[len(best) :])
    target.mkdir(parents=True, exist_ok=True)
    return target
