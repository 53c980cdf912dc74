"""One typed builder of a pool's values block (`config.worker.pools.<name>`), as the schema's own
models: `gke attach` (`levers9.providers.gke.values_block`), a join
(`levers9.providers.joined.pool_block`) and the dev stack's values each say what differs
(flavor, where the cluster is, which nodes, the tunnel) and get a `PoolConfig`; `as_values`
writes it with the schema's names, for YAML.

A field's name is checked by mypy (the pydantic plugin types `model_construct`), so a typo is a
type error, not a key nobody reads. The block is built, not validated: a GKE block lacks its
`credentials` (the private values file adds them), so it is a whole pool only once merged;
`levers9.config.parse_pool` validates what is loaded, as for any values. Pure: no I/O, nothing
but the models, so a workflow may build one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from levers9.config.pool import (
    PROVIDER,
    CacheConfig,
    KubernetesConfig,
    PoolConfig,
    TaskDefaults,
)
from levers9.providers.flavors import Flavor


def pool_values(
    *,
    gpu_type: str,
    flavor: Flavor,
    endpoint: str,
    worker_image: str,
    node_selector: Mapping[str, str],
    namespace: str | None = None,
    ca_certificate: str | None = None,
    tunnel: bool = False,
    simulated_gpus: bool | None = None,
    task_image: str | None = None,
    node_paths: bool = False,
    runtimes: Sequence[str] | None = None,
) -> PoolConfig:
    """A pool's block with only what is given set (`as_values` writes those, no default).

    Args:
        gpu_type: the pool's cards (`gpuType`).
        flavor: how the controlplane reaches the cluster (`kubernetes.flavor`).
        endpoint: the cluster's API (`kubernetes.endpoint`), an https:// URL.
        worker_image: the worker Job's image (`kubernetes.workerImage`).
        node_selector: which nodes are the pool's (`kubernetes.nodeSelector`).
        namespace: where the worker Jobs run (`kubernetes.namespace`); None: the schema's
            default, written.
        ca_certificate: the cluster's CA, base64 PEM (`kubernetes.caCertificate`); None: unset.
        tunnel: a tunnel pool: `kubernetes.tunnel: true` and `hostNetwork: false`; False: both
            unset (their defaults: no tunnel, the host network).
        simulated_gpus: `simulatedGpus` (the sandbox's cards); None: unset.
        task_image: `taskDefaults.image`, where a task that names none runs; None: unset.
        node_paths: write `imagesPath`, `durableDisksPath` and `cache` (the schema's defaults),
            as the spec's block shows them to a user who pastes it.
        runtimes: `runtimes`, those a task may name (`runtime`, runc, among them); None: unset.
    """
    written = {"flavor", "endpoint", "namespace", "node_selector", "worker_image"}
    written |= {"ca_certificate"} if ca_certificate is not None else set()
    kubernetes = KubernetesConfig.model_construct(
        _written(KubernetesConfig, written | ({"tunnel"} if tunnel else set())),
        flavor=flavor,
        endpoint=endpoint,
        ca_certificate=ca_certificate,
        namespace=_default(KubernetesConfig, "namespace") if namespace is None else namespace,
        node_selector=dict(node_selector),
        worker_image=worker_image,
        tunnel=tunnel,
    )
    written = {"mode", "provider", "gpu_type", "kubernetes"}
    written |= {"images_path", "durable_disks_path", "cache"} if node_paths else set()
    written |= {"host_network"} if tunnel else set()
    written |= {"simulated_gpus"} if simulated_gpus is not None else set()
    written |= {"task_defaults"} if task_image is not None else set()
    written |= {"runtimes"} if runtimes is not None else set()
    return PoolConfig.model_construct(
        _written(PoolConfig, written),
        mode="external",
        provider=PROVIDER,
        gpu_type=gpu_type,
        cache=CacheConfig(enabled=False),
        host_network=not tunnel,
        task_defaults=TaskDefaults.model_construct(image=task_image),
        kubernetes=kubernetes,
        simulated_gpus=bool(simulated_gpus),
        runtimes=None if runtimes is None else list(runtimes),
    )


def as_values(pool: PoolConfig) -> dict[str, Any]:
    """The block as values write it: the schema's names (`gpuType`, `kubernetes.nodeSelector`),
    only the fields set, in the schema's order."""
    return pool.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _written(model: type[BaseModel], fields: set[str]) -> set[str]:
    """`fields`, which `as_values` writes: the model's own field names (a typo fails here)."""
    unknown = fields - model.model_fields.keys()
    if unknown:
        raise ValueError(f"{model.__name__} has no field {', '.join(sorted(unknown))}")
    return fields


def _default(model: type[BaseModel], field: str) -> Any:
    return model.model_fields[field].get_default(call_default_factory=True)
