"""The worker Job, its token Secret and the pool's PodDisruptionBudget, as manifests (pure).

One privileged worker per machine, pinned to its node by required node affinity on
`kubernetes.io/hostname` (not `spec.nodeName`, which skips the scheduler and makes the kubelet
fail the pod as `OutOf...` when a neighbour got there first), taking every free card of the node
as an `nvidia.com/gpu` limit. The worker token comes from a per-worker Secret owned by the Job,
never inline in the manifest; without the tunnel, the same Secret carries the certificate and key
WorkerService serves TLS with (`levers9.rpc.worker_tls`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from levers9.contract import (
    COMMAND_DIGEST_FILE,
    CREDENTIALS_DIR,
    DEFAULT_RUNTIME,
    DEVICE_PLUGIN_DIR,
    GPU,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    TOKEN_FILE,
)
from levers9.core.capacity import MANAGED_BY, MANAGED_BY_US, NODE_LABEL, POOL_LABEL, WORKER_ID_LABEL

WORKER_COMMAND = ("levers9-worker",)
TERMINATION_GRACE_S = 30
DRAINED_LABEL = "levers9.dev/drained"
"""Set `true` on a worker's pod by the controlplane once a drain of its node took every task
off it: the pool's PodDisruptionBudget no longer selects it, and its eviction goes through."""

# Downward-API fields the agent needs: which pod it is (to find its cards in the kubelet
# checkpoint), where it runs, and the address to advertise.
_FIELD_ENV = (
    ("LEVERS9_POD_NAME", "metadata.name"),
    ("LEVERS9_POD_NAMESPACE", "metadata.namespace"),
    ("LEVERS9_POD_UID", "metadata.uid"),
    ("LEVERS9_NODE_NAME", "spec.nodeName"),
    ("LEVERS9_HOST_IP", "status.hostIP"),
    ("LEVERS9_POD_IP", "status.podIP"),
)


@dataclass(frozen=True)
class WorkerJobSpec:
    """Everything the worker Job depends on; no secret among it."""

    pool_name: str
    worker_id: str
    node_name: str
    gpus: int
    image: str
    namespace: str
    gpu_taint: bool
    """Whether the node's GPUs are tainted `nvidia.com/gpu` (GKE, joined clusters): the Job
    tolerates it (levers9.providers.flavors)."""
    host_network: bool
    tunnel: bool
    images_path: str
    durable_disks_path: str
    gateway_address: str
    advertised_host: str | None = None
    """The node's external IP, which the worker advertises (never the node name)."""
    gateway_tls: bool = False
    gateway_ca: str = ""
    """The CA (PEM, public) the worker trusts for the gateway's TLS; system roots when empty."""
    registry_mirrors: str = ""
    """The controlplane's `registryMirrors`: where the worker pulls tasks' images from too."""
    insecure_registries: str = ""
    image_cache_bytes: int = 0
    """The pool's `imageCacheSize`; 0: the worker's default."""
    image_cache_report: bool = False
    """The pool's `cache.enabled`: heartbeats report what the node's image cache holds."""
    runtime: str = DEFAULT_RUNTIME
    """The pool's `runtime`: what the agent runs its tasks with (`levers9.agent.runtimes`)."""
    runtimes: tuple[str, ...] = ()
    """The pool's `runtimes`: those its tasks may name (`runtime` among them); (): it alone."""
    task_network_allow: tuple[str, ...] = ()
    """The pool's `taskNetwork.allow`: CIDRs its tasks may reach beyond the public internet."""
    task_seccomp_profile: str = ""
    """The pool's `taskSeccompProfile`: the node path of its tasks' seccomp profile, mounted
    read-only at the same path; "": the agent's default (moby's)."""
    default_image: str = ""
    """The pool's `taskDefaults`: what a task that names no image, memory or CPUs gets."""
    default_memory_bytes: int = 0
    default_cpu_millis: int = 0
    worker_cpu_millis: int = 0
    """The pool's `workerResources`: what the worker pod requests besides its cards."""
    worker_memory_bytes: int = 0

    @property
    def job_name(self) -> str:
        return worker_job_name(self.pool_name, self.worker_id)

    @property
    def secret_name(self) -> str:
        return f"{self.job_name}-token"


def worker_job_name(pool_name: str, worker_id: str) -> str:
    """`worker-<pool>-<short id>`: deterministic, so a retried create gets 409 and is done."""
    return f"worker-{pool_name}-{worker_id}"


def worker_labels(spec: WorkerJobSpec) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGED_BY_US,
        POOL_LABEL: spec.pool_name,
        WORKER_ID_LABEL: spec.worker_id,
        NODE_LABEL: spec.node_name,
    }


def _env(spec: WorkerJobSpec) -> list[dict[str, Any]]:
    plain = [
        ("LEVERS9_GATEWAY_ADDRESS", spec.gateway_address),
        ("LEVERS9_POOL_NAME", spec.pool_name),
        ("LEVERS9_WORKER_ID", spec.worker_id),
        ("LEVERS9_TUNNEL", "true" if spec.tunnel else "false"),
        # The downward API cannot expose an extended resource's limit; the agent checks the
        # cards it finds in the kubelet checkpoint against this.
        ("LEVERS9_GPUS", str(spec.gpus)),
        ("LEVERS9_IMAGES_PATH", spec.images_path),
        ("LEVERS9_DURABLE_DISKS_PATH", spec.durable_disks_path),
        ("LEVERS9_RUNTIME", spec.runtime),
        # Where a task runs that names no image, when the pool sets no taskDefaults.image.
        ("LEVERS9_WORKER_IMAGE", spec.image),
    ]
    if set(spec.runtimes) - {spec.runtime}:
        plain.append(("LEVERS9_RUNTIMES", ",".join(spec.runtimes)))
    if spec.task_network_allow:
        plain.append(("LEVERS9_TASK_NETWORK_ALLOW", ",".join(spec.task_network_allow)))
    if spec.task_seccomp_profile:
        plain.append(("LEVERS9_TASK_SECCOMP_PROFILE", spec.task_seccomp_profile))
    if spec.advertised_host:
        plain.append(("LEVERS9_ADVERTISED_HOST", spec.advertised_host))
    if spec.gateway_tls:
        plain.append(("LEVERS9_GATEWAY_TLS", "true"))
    if spec.gateway_ca:
        plain.append(("LEVERS9_GATEWAY_CA", spec.gateway_ca))
    if spec.registry_mirrors:
        plain.append(("LEVERS9_REGISTRY_MIRRORS", spec.registry_mirrors))
    if spec.insecure_registries:
        plain.append(("LEVERS9_INSECURE_REGISTRIES", spec.insecure_registries))
    if spec.image_cache_bytes:
        plain.append(("LEVERS9_IMAGE_CACHE_BYTES", str(spec.image_cache_bytes)))
    if spec.image_cache_report:
        plain.append(("LEVERS9_IMAGE_CACHE_REPORT", "true"))
    if spec.default_image:
        plain.append(("LEVERS9_DEFAULT_IMAGE", spec.default_image))
    if spec.default_memory_bytes:
        plain.append(("LEVERS9_DEFAULT_MEMORY_BYTES", str(spec.default_memory_bytes)))
    if spec.default_cpu_millis:
        plain.append(("LEVERS9_DEFAULT_CPU_MILLIS", str(spec.default_cpu_millis)))
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in plain]
    env += [
        {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for name, path in _FIELD_ENV
    ]
    # The credentials are files of the mounted Secret (_volumes), never environment values.
    env.append({"name": "LEVERS9_CREDENTIALS_DIR", "value": CREDENTIALS_DIR})
    return env


def _secret_keys(spec: WorkerJobSpec) -> list[str]:
    """What the worker's Secret gives it: its token, the digest of the controlplane's command
    token, and without the tunnel its TLS pair (a tunnelled worker serves on a unix socket
    inside the tunnel)."""
    held = [TOKEN_FILE, COMMAND_DIGEST_FILE]
    return held if spec.tunnel else [*held, TLS_CERT_FILE, TLS_KEY_FILE]


def _volumes(spec: WorkerJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts = [
        ("images", spec.images_path, "DirectoryOrCreate", False),
        ("durable-disks", spec.durable_disks_path, "DirectoryOrCreate", False),
        *(
            [("seccomp-profile", spec.task_seccomp_profile, "File", True)]
            if spec.task_seccomp_profile
            else []
        ),
        ("device-plugins", DEVICE_PLUGIN_DIR, "Directory", True),
    ]
    volumes = [
        {"name": name, "hostPath": {"path": path, "type": kind}} for name, path, kind, _ in mounts
    ]
    volume_mounts = [
        {"name": name, "mountPath": path, "readOnly": read_only}
        for name, path, _, read_only in mounts
    ]
    volumes.append(
        {
            "name": "credentials",
            "secret": {
                "secretName": spec.secret_name,
                "defaultMode": 0o400,
                "items": [{"key": key, "path": key} for key in _secret_keys(spec)],
            },
        }
    )
    volume_mounts.append({"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True})
    return volumes, volume_mounts


def worker_job(spec: WorkerJobSpec) -> dict[str, Any]:
    """The batch/v1 Job that runs one worker on `spec.node_name` with `spec.gpus` cards."""
    labels = worker_labels(spec)
    volumes, volume_mounts = _volumes(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostNetwork": spec.host_network,
        "dnsPolicy": "ClusterFirstWithHostNet" if spec.host_network else "ClusterFirst",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [spec.node_name],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "containers": [
            {
                "name": "worker",
                "image": spec.image,
                "imagePullPolicy": "Always",
                "command": list(WORKER_COMMAND),
                "env": _env(spec),
                "resources": _resources(spec),
                "securityContext": {"privileged": True},
                "volumeMounts": volume_mounts,
            }
        ],
        "volumes": volumes,
    }
    if spec.gpu_taint:
        # GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule; a NoExecute one (an admin's)
        # would evict the worker as capacity, which tolerates any effect, would not expect.
        pod_spec["tolerations"] = [{"key": GPU, "operator": "Exists"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.job_name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def worker_token_secret(
    spec: WorkerJobSpec,
    token: str,
    job_uid: str | None = None,
    tls: tuple[str, str] | None = None,
    *,
    command_digest: str,
) -> dict[str, Any]:
    """The Secret the worker reads its token from, the digest of the controlplane's command
    token it checks calls against, and with `tls` (certificate, key; PEM) what it serves TLS
    with; owned by the Job once it exists."""
    metadata: dict[str, Any] = {
        "name": spec.secret_name,
        "namespace": spec.namespace,
        "labels": worker_labels(spec),
    }
    if job_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": spec.job_name,
                "uid": job_uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "stringData": {TOKEN_FILE: token, COMMAND_DIGEST_FILE: command_digest}
        | ({TLS_CERT_FILE: tls[0], TLS_KEY_FILE: tls[1]} if tls else {}),
    }


def disruption_budget_name(pool_name: str) -> str:
    """`workers-<pool>`: one per pool in its namespace (several pools may share one)."""
    return f"workers-{pool_name}"


def worker_disruption_budget(pool_name: str, namespace: str) -> dict[str, Any]:
    """The policy/v1 PodDisruptionBudget over the pool's worker pods that are not drained yet,
    allowing none of them to be evicted: `kubectl drain` (a GKE upgrade) retries its eviction
    until the controlplane took the worker's tasks off it and labelled its pod `DRAINED_LABEL`.
    A worker pod that is not Ready (pending, its image pulling) may always go."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": disruption_budget_name(pool_name),
            "namespace": namespace,
            "labels": {MANAGED_BY: MANAGED_BY_US, POOL_LABEL: pool_name},
        },
        "spec": {
            "maxUnavailable": 0,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {
                "matchLabels": {MANAGED_BY: MANAGED_BY_US, POOL_LABEL: pool_name},
                "matchExpressions": [
                    {"key": DRAINED_LABEL, "operator": "NotIn", "values": ["true"]},
                    {"key": WORKER_ID_LABEL, "operator": "Exists"},
                ],
            },
        },
    }


def drained_patch() -> dict[str, Any]:
    """The merge patch that takes a worker's pod out of its pool's PodDisruptionBudget."""
    return {"metadata": {"labels": {DRAINED_LABEL: "true"}}}


def namespace(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGED_BY_US}},
    }


def _resources(spec: WorkerJobSpec) -> dict[str, dict[str, str]]:
    """Every free card as a limit; CPU and memory requested, not limited (Burstable: the agent
    unpacking an image may use more for a while, and a limit would throttle or kill it)."""
    requests = {GPU: str(spec.gpus)}
    if spec.worker_cpu_millis:
        requests["cpu"] = f"{spec.worker_cpu_millis}m"
    if spec.worker_memory_bytes:
        requests["memory"] = str(spec.worker_memory_bytes)
    return {"limits": {GPU: str(spec.gpus)}, "requests": requests}
