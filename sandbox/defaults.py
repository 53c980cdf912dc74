"""Defaulting and admission the apiserver applies on create, so stored objects look like GKE's.

What a client reads back matters to it: a pod comes back with `status.phase: Pending`, its QoS
class, the default tolerations for not-ready/unreachable nodes and the `default` service
account; a Job with its generated selector and `job-name` labels; a namespace with its
`kubernetes.io/metadata.name` label. Code that is proven against the emulator then meets the
same shapes on a real cluster.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from sandbox.resources import (
    CLUSTER_ROLE_BINDINGS,
    DAEMON_SETS,
    DEPLOYMENTS,
    JOBS,
    NAMESPACES,
    PODS,
    RBAC_GROUP,
    REPLICA_SETS,
    ROLE_BINDINGS,
    SECRETS,
    Resource,
)

Defaulter = Callable[[dict[str, Any]], None]

_DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)


def _image_pull_policy(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    if "@" in name:
        return "IfNotPresent"
    tag = name.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _container(container: dict[str, Any]) -> None:
    container.setdefault("resources", {})
    resources = container["resources"]
    limits = resources.get("limits")
    if limits:
        # Requests default to limits, per resource, as the apiserver's defaulting does.
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", _image_pull_policy(str(container.get("image", ""))))


def pod_spec(spec: dict[str, Any], *, restart_policy: str | None = "Always") -> None:
    """Defaults shared by pods and pod templates (`SetDefaults_PodSpec`)."""
    if restart_policy is not None:
        spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            if isinstance(container, dict):
                _container(container)


def qos_class(spec: dict[str, Any]) -> str:
    requests_seen = limits_seen = False
    guaranteed = True
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        requests_seen = requests_seen or bool(requests)
        limits_seen = limits_seen or bool(limits)
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not requests_seen and not limits_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _pod(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    pod_spec(spec)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for default in _DEFAULT_TOLERATIONS:
        if not any(t.get("key") == default["key"] for t in tolerations):
            tolerations.append(dict(default))
    status = obj.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status["qosClass"] = qos_class(spec)


def _template(obj: dict[str, Any], restart_policy: str | None) -> None:
    template = obj.setdefault("spec", {}).setdefault("template", {})
    template.setdefault("metadata", {})
    pod_spec(template.setdefault("spec", {}), restart_policy=restart_policy)


def _deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy.setdefault("type", "RollingUpdate")
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    _template(obj, "Always")
    obj.setdefault("status", {})


def _replica_set(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {}).setdefault("replicas", 1)
    _template(obj, "Always")
    obj.setdefault("status", {"replicas": 0})


def _daemon_set(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault(
        "updateStrategy",
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
    )
    spec.setdefault("revisionHistoryLimit", 10)
    _template(obj, "Always")
    obj.setdefault(
        "status",
        {
            "currentNumberScheduled": 0,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": 0,
            "numberReady": 0,
        },
    )


def _job(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    spec = obj.setdefault("spec", {})
    if "parallelism" not in spec and "completions" not in spec:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    if not spec.get("manualSelector"):
        # The job controller's selector is the Job's own uid, stamped on its pod template.
        uid, name = meta["uid"], meta["name"]
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
    _template(obj, None)
    obj.setdefault("status", {})


def _namespace(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    labels = meta.setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = meta["name"]
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj.setdefault("status", {}).setdefault("phase", "Active")


def secret_data(obj: dict[str, Any]) -> None:
    """Folds write-only `stringData` into base64 `data`, as the apiserver does on every write."""
    string_data = obj.pop("stringData", None)
    if string_data:
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _secret(obj: dict[str, Any]) -> None:
    obj.setdefault("type", "Opaque")
    secret_data(obj)


def _role_binding(obj: dict[str, Any]) -> None:
    # `SetDefaults_Subject`: User and Group subjects are RBAC's.
    for subject in obj.get("subjects") or []:
        user_or_group = isinstance(subject, dict) and subject.get("kind") in ("User", "Group")
        if user_or_group and not subject.get("apiGroup"):
            subject["apiGroup"] = RBAC_GROUP


_DEFAULTERS: dict[Resource, Defaulter] = {
    PODS: _pod,
    DEPLOYMENTS: _deployment,
    REPLICA_SETS: _replica_set,
    DAEMON_SETS: _daemon_set,
    JOBS: _job,
    NAMESPACES: _namespace,
    SECRETS: _secret,
    ROLE_BINDINGS: _role_binding,
    CLUSTER_ROLE_BINDINGS: _role_binding,
}


def apply_defaults(resource: Resource, obj: dict[str, Any]) -> None:
    """Fills defaults in place, on create and on update alike (the apiserver defaults every
    object it decodes); `metadata.name` and `metadata.uid` are already set."""
    defaulter = _DEFAULTERS.get(resource)
    if defaulter is not None:
        defaulter(obj)
