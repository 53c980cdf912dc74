"""The Kubernetes side of a pool: observe it, keep the namespace, create and delete worker Jobs.

Every create has a deterministic name (409 means done) and every delete treats 404 as done, so a
retried activity changes nothing twice. API errors are mapped by HTTP meaning: 401/403/404/422
are permanent and say what to do (the spec's troubleshooting rows), 429/5xx/timeouts retry.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import urllib3
from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_clients import KubeClients, UnknownPool
from levers9.config import ControlplaneSettings, PoolConfig
from levers9.core import manifests
from levers9.core.capacity import (
    GKE_GPU_TOLERATION,
    MANAGED_BY,
    MANAGED_BY_US,
    POOL_LABEL,
    WORKER_ID_LABEL,
    NodeCapacity,
    PoolView,
    Resources,
    pool_capacity,
)
from levers9.logs import get_logger
from levers9.models import PodState, WorkerJobInput
from levers9.providers.flavors import JOINED_GPU_TAINT, flavor_rules
from levers9.rpc import tls
from levers9.rpc.worker_tls import worker_ca
from levers9.telemetry import span
from levers9.tokens import command_digest, command_token, worker_token

PAGE = 500
BOUND_AND_RUNNING = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
FIX_403 = (
    "the controlplane's egress IP is not on the cluster's authorized networks, or the key lacks"
    " roles/container.developer: rerun deploy/gke/attach-gke-pool.sh"
)
FIX_401 = (
    "the service-account key was deleted or is not this cluster's project's:"
    " rerun deploy/gke/attach-gke-pool.sh and deploy its key"
)
PERMANENT = {401, 403, 404, 422}

log = get_logger("levers9.kube")
T = TypeVar("T")


FIX_403_JOINED = (
    "the agent's RBAC (what `levers9 cluster join` installed) does not grant it: apply the join's"
    " Role and ClusterRole again"
)


def kube_error(exc: Exception, doing: str, pool_name: str, joined: bool = False) -> Exception:
    """An ApplicationError for a permanent API error (with its fix); the error itself otherwise."""
    if isinstance(exc, UnknownPool):
        return ApplicationError(
            f"pool {pool_name} is not loaded on this Temporal worker: add its block under"
            " config.worker.pools (levers9 config check -f ... says what is wrong with it)",
            type="PoolNotLoaded",
            non_retryable=True,
        )
    if not isinstance(exc, k8s.ApiException) or exc.status not in PERMANENT:
        return exc
    message = _status_message(exc)
    fix = {403: FIX_403_JOINED if joined else FIX_403, 401: FIX_401}.get(exc.status)
    text = f"{exc.status} {exc.reason}: {message}" + (f" ({fix})" if fix else "")
    return ApplicationError(f"{doing}: {text}", type=f"Kubernetes{exc.status}", non_retryable=True)


def _status_message(exc: k8s.ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason)
    return str(body.get("message") or exc.reason)


def _list_all(
    call: Callable[..., Any], **kwargs: Any
) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """Pages of a list call as raw JSON (model objects would cost seconds at 100,000 pods)."""
    token = None
    while True:
        response = call(limit=PAGE, _continue=token, _preload_content=False, **kwargs)
        page = json.loads(response.data)
        yield page.get("items") or [], 1
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def gpu_taint(pool: PoolConfig) -> bool:
    """Whether the pool's GPU nodes carry the `nvidia.com/gpu` taint: by its flavor, and always
    for a joined cluster (levers9.providers.flavors)."""
    if pool.kubernetes.joined:
        return JOINED_GPU_TAINT
    return flavor_rules(pool.kubernetes.flavor).gpu_taint


def pool_view(pool_name: str, pool: PoolConfig) -> PoolView:
    tolerations = (GKE_GPU_TOLERATION,) if gpu_taint(pool) else ()
    worker = Resources(
        cpu_millis=pool.worker_resources.cpu_millis,
        memory_bytes=pool.worker_resources.memory_bytes,
    )
    return PoolView(pool_name, pool.kubernetes.node_selector, tolerations, worker)


def job_selector(pool_name: str) -> str:
    return f"{MANAGED_BY}={MANAGED_BY_US},{POOL_LABEL}={pool_name}"


def node_selector(pool: PoolConfig) -> str | None:
    """The pool's `nodeSelector` as a label selector; None for every node."""
    return ",".join(f"{k}={v}" for k, v in pool.kubernetes.node_selector.items()) or None


class Cached(Protocol):
    """A watch-fed view of a pool (activities/pool_cache.py)."""

    def capacity(self) -> dict[str, NodeCapacity] | None: ...

    def kick(self) -> None: ...


class KubeObserver:
    """What a pass needs: from the pool's watch-fed cache when this process has one and it is
    synced (one GET, no list), else listed, in a constant number of calls (plus pagination)."""

    def __init__(
        self, clients: KubeClients, caches: Callable[[str], Cached | None] | None = None
    ) -> None:
        self._clients = clients
        self._caches = caches

    def observe(self, pool_name: str) -> tuple[dict[str, NodeCapacity], int]:
        """Per-node capacity of the pool, and how many API calls it took."""
        cache = self._caches(pool_name) if self._caches is not None else None
        if cache is not None:
            cached = cache.capacity()
            if cached is not None:
                self.probe(pool_name)
                return cached, 1
        listed = self.list_capacity(pool_name)
        if cache is not None:
            cache.kick()  # the cluster answers: its watches need not wait out their backoff
        return listed

    def probe(self, pool_name: str) -> None:
        """One GET (the pool's namespace; 404 is an answer too) proving the cluster still
        answers us: a watch opened before a key was revoked or the egress IP moved keeps
        streaming, and a pass must still stop with the 401/403 and its fix."""
        pool = self._clients.pool(pool_name)
        core = k8s.CoreV1Api(self._clients.api(pool_name))
        try:
            core.read_namespace(pool.kubernetes.namespace, _preload_content=False)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    def list_capacity(self, pool_name: str) -> tuple[dict[str, NodeCapacity], int]:
        """Per-node capacity of the pool from three lists, and how many calls they took."""
        pool = self._clients.pool(pool_name)
        api = self._clients.api(pool_name)
        core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
        calls = 0
        nodes: list[dict[str, Any]] = []
        for items, n in _list_all(core.list_node, label_selector=node_selector(pool)):
            nodes += items
            calls += n
        pods: list[dict[str, Any]] = []
        for items, n in _list_all(
            core.list_pod_for_all_namespaces, field_selector=BOUND_AND_RUNNING
        ):
            pods += items
            calls += n
        jobs: list[dict[str, Any]] = []
        for items, n in _list_all(
            batch.list_namespaced_job,
            namespace=pool.kubernetes.namespace,
            label_selector=job_selector(pool_name),
        ):
            jobs += items
            calls += n
        return self.capacity(nodes, pods, jobs, pool_view(pool_name, pool)), calls

    def capacity(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        jobs: list[dict[str, Any]],
        view: PoolView,
    ) -> dict[str, NodeCapacity]:
        """The pure part of an observation (the benchmark times it on its own)."""
        return pool_capacity(nodes, pods, jobs, view)


class KubeActivities:
    """Worker Jobs and the namespace; clients injected."""

    def __init__(self, clients: KubeClients, settings: ControlplaneSettings) -> None:
        self._clients = clients
        self._settings = settings

    async def _call(self, pool_name: str, doing: str, fn: Callable[[], T]) -> T:
        try:
            with span(f"kubernetes {doing}", pool_name=pool_name):
                return await asyncio.to_thread(fn)
        except (k8s.ApiException, UnknownPool) as exc:
            raise kube_error(exc, doing, pool_name, self._clients.joined(pool_name)) from None
        except urllib3.exceptions.HTTPError as exc:
            # Timeouts and refused or dropped connections: retried by Temporal with backoff.
            raise ApplicationError(
                f"{doing}: {type(exc).__name__}", type="KubernetesUnavailable"
            ) from None

    @activity.defn
    async def create_worker_job(self, input: WorkerJobInput) -> str:
        """Namespace, Job, then its token Secret owned by the Job (with the certificate the
        worker serves TLS with, issued here); returns the Job's name."""
        return await self._call(input.pool_name, "create worker Job", lambda: self._create(input))

    def _create(self, input: WorkerJobInput) -> str:
        secret_value = self._settings.token_secret()
        if secret_value is None:
            raise ApplicationError(
                "no worker token secret: set workerTokenSecret or workerTokenSecretFile"
                " (LEVERS9_WORKER_TOKEN_SECRET[_FILE]) for the controlplane",
                type="ConfigMissing",
                non_retryable=True,
            )
        pool = self._clients.pool(input.pool_name)
        api = self._clients.api(input.pool_name)
        core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
        spec = worker_spec(input, pool, self._settings)
        if not pool.kubernetes.joined:  # a joined cluster's namespace is the join's own
            _create_or_exists(
                lambda: core.create_namespace(_body(manifests.namespace(spec.namespace)))
            )
        # Before the Job: a drain that comes while the worker starts already waits for it.
        budget = manifests.worker_disruption_budget(input.pool_name, spec.namespace)
        try:
            _create_or_exists(
                lambda: k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
                    spec.namespace, _body(budget)
                )
            )
        except k8s.ApiException as exc:
            if exc.status != 403 or not pool.kubernetes.joined:
                raise
            # A cluster joined before the budget: its workers run, and a drain does not wait.
            log.warning(
                "worker disruption budget not created: a drain will not wait for the agent",
                pool_name=input.pool_name,
                error=f"403 {_status_message(exc)}",
                fix=FIX_403_JOINED,
            )
        _create_or_exists(
            lambda: batch.create_namespaced_job(spec.namespace, _body(manifests.worker_job(spec)))
        )
        raw: Any = batch.read_namespaced_job(spec.job_name, spec.namespace, _preload_content=False)
        job = json.loads(raw.data)
        secret_text = secret_value.get_secret_value()
        generation = self._settings.worker_token_generation
        token = worker_token(secret_text, spec.worker_id, generation)
        serving = None
        if not spec.tunnel:
            ca = worker_ca(secret_text, self._settings.worker_ca_generation)
            issued = ca.issue(spec.worker_id, dt.datetime.now(dt.UTC))
            serving = (issued.cert_pem, issued.key_pem)
        secret = manifests.worker_token_secret(
            spec,
            token,
            job_uid=job["metadata"]["uid"],
            tls=serving,
            command_digest=command_digest(command_token(secret_text, spec.worker_id, generation)),
        )
        _create_or_exists(lambda: core.create_namespaced_secret(spec.namespace, _body(secret)))
        return spec.job_name

    @activity.defn
    async def delete_worker_job(self, input: WorkerJobInput) -> bool:
        """Deletes the Job and, through ownership, its pod and token Secret; False if gone."""
        return await self._call(input.pool_name, "delete worker Job", lambda: self._delete(input))

    def _delete(self, input: WorkerJobInput) -> bool:
        pool = self._clients.pool(input.pool_name)
        batch = k8s.BatchV1Api(self._clients.api(input.pool_name))
        name = manifests.worker_job_name(input.pool_name, input.worker_id)
        try:
            batch.delete_namespaced_job(
                name, pool.kubernetes.namespace, propagation_policy="Background"
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    @activity.defn
    async def mark_worker_drained(self, input: WorkerJobInput) -> int:
        """Labels the worker's pods `levers9.dev/drained=true`: out of the pool's
        PodDisruptionBudget, so that the drain's next eviction of them goes through. Returns
        how many it labelled (0: gone already)."""
        return await self._call(
            input.pool_name, "label the drained worker's pod", lambda: self._mark_drained(input)
        )

    def _mark_drained(self, input: WorkerJobInput) -> int:
        pool = self._clients.pool(input.pool_name)
        core = k8s.CoreV1Api(self._clients.api(input.pool_name))
        namespace = pool.kubernetes.namespace
        pods, _ = next(
            _list_all(
                core.list_namespaced_pod,
                namespace=namespace,
                label_selector=f"{WORKER_ID_LABEL}={input.worker_id}",
            )
        )
        labelled = 0
        for pod in pods:
            try:
                core.patch_namespaced_pod(
                    pod["metadata"]["name"], namespace, _body(manifests.drained_patch())
                )
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            labelled += 1
        return labelled

    @activity.defn
    async def describe_worker_pod(self, input: WorkerJobInput) -> PodState:
        """The worker's Job and pod, as a pending worker's record follows them."""
        return await self._call(input.pool_name, "describe worker pod", lambda: self._pod(input))

    def _pod(self, input: WorkerJobInput) -> PodState:
        pool = self._clients.pool(input.pool_name)
        api = self._clients.api(input.pool_name)
        namespace = pool.kubernetes.namespace
        name = manifests.worker_job_name(input.pool_name, input.worker_id)
        try:
            raw: Any = k8s.BatchV1Api(api).read_namespaced_job(
                name, namespace, _preload_content=False
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return PodState(exists=False, job_exists=False)
            raise
        job = json.loads(raw.data)
        pods, _ = next(
            _list_all(
                k8s.CoreV1Api(api).list_namespaced_pod,
                namespace=namespace,
                label_selector=f"{WORKER_ID_LABEL}={input.worker_id}",
            )
        )
        state = pod_state(job, pods)
        if input.node_name and (state.job_failed or state.phase == "Failed"):
            # Pod GC fails the pods of a deleted node, and the Job fails with them: that is the
            # node leaving, not the worker failing (the machine stops it for the same reason).
            try:
                k8s.CoreV1Api(api).read_node(input.node_name, _preload_content=False)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
                return state.model_copy(update={"node_gone": True})
        return state


def pod_state(job: dict[str, Any], pods: list[dict[str, Any]]) -> PodState:
    """Condenses a Job and its pods into what the worker record needs."""
    failed = any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for c in job.get("status", {}).get("conditions") or ()
    )
    failure = next(
        (
            c.get("message") or c.get("reason")
            for c in job.get("status", {}).get("conditions") or ()
            if c.get("type") == "Failed"
        ),
        None,
    )
    if not pods:
        return PodState(exists=False, job_failed=failed, message=failure)
    status = pods[-1].get("status", {})
    waiting = reason = exit_code = None
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        if "waiting" in state:
            waiting = state["waiting"].get("reason")
            reason = state["waiting"].get("message")
        elif "terminated" in state:
            terminated = state["terminated"]
            reason = terminated.get("message") or terminated.get("reason")
            exit_code = terminated.get("exitCode")
    return PodState(
        exists=True,
        phase=status.get("phase"),
        waiting_reason=waiting,
        message=reason or failure,
        job_failed=failed,
        exit_code=exit_code,
    )


def worker_spec(
    input: WorkerJobInput, pool: PoolConfig, settings: ControlplaneSettings
) -> manifests.WorkerJobSpec:
    kube = pool.kubernetes
    ca = tls.gateway_ca_pem(settings)
    return manifests.WorkerJobSpec(
        pool_name=input.pool_name,
        worker_id=input.worker_id,
        node_name=input.node_name,
        gpus=input.gpus,
        image=kube.worker_image,
        namespace=kube.namespace,
        gpu_taint=gpu_taint(pool),
        host_network=pool.host_network,
        tunnel=kube.tunnel,
        images_path=pool.images_path,
        durable_disks_path=pool.durable_disks_path,
        gateway_address=settings.gateway_advertised_address,
        advertised_host=input.external_ip,
        gateway_tls=settings.gateway_uses_tls(),
        gateway_ca=ca.decode() if ca else "",
        registry_mirrors=settings.registry_mirrors,
        insecure_registries=settings.insecure_registries,
        image_cache_bytes=pool.image_cache_bytes,
        image_cache_report=pool.cache.enabled,
        runtime=pool.runtime,
        runtimes=pool.offered_runtimes,
        task_network_allow=tuple(pool.task_network.allow),
        task_seccomp_profile=pool.task_seccomp_profile or "",
        default_image=pool.task_defaults.image or "",
        default_memory_bytes=pool.task_defaults.memory_bytes,
        default_cpu_millis=pool.task_defaults.cpu_millis,
        worker_cpu_millis=pool.worker_resources.cpu_millis,
        worker_memory_bytes=pool.worker_resources.memory_bytes,
    )


def _body(manifest: dict[str, Any]) -> Any:
    """The client serializes plain dicts as they are; its signatures ask for model objects."""
    return manifest


def _create_or_exists(create: Callable[[], object]) -> None:
    try:
        create()
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
