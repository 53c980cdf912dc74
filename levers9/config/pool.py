"""Per-pool settings: one block under `config.worker.pools` with `provider: kubernetes`, as
pydantic models (`PoolConfig` and its parts: `KubernetesConfig`, `TaskDefaults`,
`WorkerResources`, `CacheConfig`), each field checked where it is declared.

Credentials are `SecretStr` (never in a repr, a dump, a log line or an error message);
`credentialsFile` is read when the block validates, never at import time."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from levers9.contract import (
    DEFAULT_RUNTIME,
    DNS_LABEL,
    TASK_RUNTIMES,
    label_problem,
    pool_runtime_problem,
)
from levers9.providers.flavors import Flavor, flavor_rules

PROVIDER: Final = "kubernetes"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        hide_input_in_errors=True,
        str_strip_whitespace=True,
        # Built when first used: the CLI validates its settings only, not the values models.
        defer_build=True,
    )


class CacheConfig(_Model):
    enabled: bool = False


class KubernetesConfig(_Model):
    """How the controlplane reaches the cluster, and what the worker Job looks like there."""

    flavor: Flavor = "gke"
    endpoint: str
    ca_certificate: str | None = Field(default=None, alias="caCertificate")
    namespace: str = "levers9"
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    worker_image: str = Field(alias="workerImage", min_length=1)
    credentials: SecretStr | None = None
    credentials_file: Path | None = Field(default=None, alias="credentialsFile")
    tunnel: bool = False

    _credentials: SecretStr | None = PrivateAttr(default=None)
    _joined: bool = PrivateAttr(default=False)

    @property
    def joined(self) -> bool:
        """Made by `levers9 cluster join` (never by values): reached through its agent's
        tunnel, never at `endpoint`, with no credentials of ours."""
        return self._joined

    @field_validator("endpoint")
    @classmethod
    def _https_endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(
                "must be an https:// URL with a host (the cluster endpoint, e.g."
                " https://34.118.0.10 from `gcloud container clusters describe`)"
            )
        return value.rstrip("/")

    @field_validator("ca_certificate")
    @classmethod
    def _pem_certificate(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from cryptography import x509

        try:
            x509.load_pem_x509_certificate(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(
                "not a base64 PEM certificate (use masterAuth.clusterCaCertificate from"
                " `gcloud container clusters describe`)"
            ) from None
        return value

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            problem = label_problem(key, label)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid namespace name (a DNS-1123 label)")
        return value

    @field_validator("worker_image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        if any(ch.isspace() for ch in value):
            raise ValueError("an image reference has no whitespace")
        return value

    @model_validator(mode="after")
    def _one_credential(self) -> KubernetesConfig:
        if self.credentials is not None and self.credentials_file is not None:
            raise ValueError(
                "set either credentials or credentialsFile, not both"
                " (credentials: the key inline, from your private values file)"
            )
        rules = flavor_rules(self.flavor)
        if rules.needs_credentials and self.credentials is None and self.credentials_file is None:
            raise ValueError(rules.needs_credentials)
        if rules.needs_ca and self.ca_certificate is None:
            raise ValueError(rules.needs_ca)
        secret = self.credentials
        if self.credentials_file is not None:
            secret = SecretStr(_read_credentials_file(self.credentials_file))
        if secret is not None:
            rules.check_credentials(secret.get_secret_value())
        self._credentials = secret
        return self

    def resolved_credentials(self) -> SecretStr | None:
        """The key (or token/kubeconfig for generic), inline or read from credentialsFile."""
        return self._credentials


def _read_credentials_file(path: Path) -> str:
    full = path.expanduser()
    try:
        return full.read_text()
    except OSError as exc:
        raise ValueError(
            f"credentialsFile: cannot read {full}: {exc.strerror or type(exc).__name__}"
        ) from None


def _quantity_text(value: Any) -> Any:
    """A quantity written as a number (`memory: 8`, YAML's int) is the same quantity as its
    text, as Kubernetes reads it (bytes, cores)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (
            format(value, "f").rstrip("0").rstrip(".") if isinstance(value, float) else str(value)
        )
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    WithJsonSchema({"type": ["string", "number"]}),
]
"""A Kubernetes quantity as values write it: `8Gi`, `500m`, or a number (`memory: 8`, bytes)."""


def _positive_quantity(value: str) -> str:
    """A Kubernetes quantity above 0, as given; ValueError naming it otherwise."""
    from levers9.core.quantity import parse_quantity

    if parse_quantity(value) <= 0:
        raise ValueError(f"{value!r} is not more than 0")
    return value


Runtime = Annotated[str, WithJsonSchema({"enum": list(TASK_RUNTIMES)})]
"""A pool's `runtime`: one of levers9.contract.TASK_RUNTIMES (`process`, the agent's tests' own,
is refused saying so)."""


class TaskDefaults(_Model):
    """What a task gets when `levers9 run` does not say: its image, memory and CPU limits.

    Without an `image` here, a task given no `--image` runs in a container of the worker's own
    image (`kubernetes.workerImage`, its command as given): never outside a container."""

    image: str | None = None
    memory: Quantity | None = None
    """A Kubernetes quantity (`8Gi`); unset: no memory limit of its own."""
    cpus: Quantity | None = None
    """A Kubernetes quantity (`4`, `500m`); unset: no CPU limit."""

    @field_validator("image")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from levers9.core.image_reference import ImageReference, ImageReferenceError

        try:
            ImageReference.parse(value)
        except ImageReferenceError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("memory", "cpus")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        return None if value is None else _positive_quantity(value)

    @field_validator("memory")
    @classmethod
    def _memory_floor(cls, value: str | None) -> str | None:
        from levers9.core.quantity import whole
        from levers9.models import memory_floor_problem

        below = memory_floor_problem(whole(value)) if value is not None else None
        if below is not None:
            raise ValueError(below)
        return value

    @property
    def memory_bytes(self) -> int:
        from levers9.core.quantity import whole

        return whole(self.memory) if self.memory else 0

    @property
    def cpu_millis(self) -> int:
        from levers9.core.quantity import millicores

        return millicores(self.cpus) if self.cpus else 0


class TaskNetwork(_Model):
    """What a pool's tasks may reach besides the public internet. Each task has a network of
    its own (levers9.agent.task_network): by default it reaches neither the node nor
    link-local (169.254/16: no metadata server), private (10/8, 172.16/12, 192.168/16,
    100.64/10, fc00::/7) or another task's addresses."""

    allow: list[str] = Field(default_factory=list)
    """CIDRs its tasks may reach though private or link-local (`10.8.0.0/16`, a cluster's model
    store); the node's own addresses stay out of reach even inside one."""

    @field_validator("allow")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=True)
            except ValueError as exc:
                raise ValueError(
                    f"{item!r} is not a CIDR ({exc}); write a network such as 10.8.0.0/16"
                ) from None
        return value


class WorkerResources(_Model):
    """What the worker pod requests besides its cards (the agent, image pulls, unpacking): so
    it is Burstable, never BestEffort, and not the first pod the kubelet evicts. A node whose
    neighbours leave less than this gets no worker (`machine list` says `TooSmall`)."""

    cpu: Quantity = "500m"
    memory: Quantity = "1Gi"

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, value: str) -> str:
        return _positive_quantity(value)

    @property
    def cpu_millis(self) -> int:
        from levers9.core.quantity import millicores

        return millicores(self.cpu)

    @property
    def memory_bytes(self) -> int:
        from levers9.core.quantity import whole

        return whole(self.memory)


class PoolConfig(_Model):
    """One block under `config.worker.pools` with `provider: kubernetes`."""

    mode: Literal["external"]
    provider: Literal["kubernetes"]
    gpu_type: str = Field(alias="gpuType", min_length=1)
    images_path: str = Field(default="/var/lib/levers9/images", alias="imagesPath")
    durable_disks_path: str = Field(default="/var/lib/levers9/disks", alias="durableDisksPath")
    image_cache_size: Quantity = Field(default="100Gi", alias="imageCacheSize")
    """How much of `imagesPath` tasks' images may fill before the least recently used go."""
    cache: CacheConfig = Field(default_factory=CacheConfig)
    host_network: bool = Field(default=True, alias="hostNetwork")
    runtime: Runtime = DEFAULT_RUNTIME
    """How the pool's workers run its tasks (`levers9.agent.runtimes`): `runc`, a task in its
    image (a task of none in `taskDefaults.image`, else the worker's image); `runsc`, a task in
    its image in a gVisor sandbox. Never `process` (the agent's own tests' runtime)."""
    runtimes: list[Runtime] | None = None
    """The runtimes its tasks may name (`levers9 run --runtime runsc`), `runtime` among them (the
    one a task that names none runs in); unset: `runtime` alone."""
    task_defaults: TaskDefaults = Field(default_factory=TaskDefaults, alias="taskDefaults")
    task_network: TaskNetwork = Field(default_factory=TaskNetwork, alias="taskNetwork")
    task_seccomp_profile: str | None = Field(default=None, alias="taskSeccompProfile")
    """The node path of the seccomp profile (Docker's format) its runc tasks run under; unset:
    moby's default, which the agent carries (levers9/agent/seccomp/). The worker Job mounts it
    read-only; the agent refuses to start on a file that is not a profile, naming this field."""
    worker_resources: WorkerResources = Field(
        default_factory=WorkerResources, alias="workerResources"
    )
    kubernetes: KubernetesConfig
    simulated_gpus: bool = Field(default=False, alias="simulatedGpus", strict=True)
    """The pool's cards are simulated (the sandbox): its GPU check expects the container to see
    no card. Never set on a real pool: there a container that saw no card fails the check."""

    @field_validator("image_cache_size")
    @classmethod
    def _size(cls, value: str) -> str:
        return _positive_quantity(value)

    @property
    def image_cache_bytes(self) -> int:
        from levers9.core.quantity import whole

        return whole(self.image_cache_size)

    @field_validator("images_path", "durable_disks_path", "task_seccomp_profile")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not PurePosixPath(value).is_absolute():
            raise ValueError("must be an absolute path on the node (COS keeps / read-only)")
        return value

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        problem = pool_runtime_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("empty: list the runtimes tasks may name (runc, runsc), or unset it")
        for name in value:
            problem = pool_runtime_problem(name)
            if problem is not None:
                raise ValueError(problem)
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice")
        return value

    @model_validator(mode="after")
    def _runtimes_hold_the_runtime(self) -> PoolConfig:
        if self.runtimes is not None and self.runtime not in self.runtimes:
            raise ValueError(
                f"runtimes: [{', '.join(self.runtimes)}] does not hold runtime {self.runtime} (what"
                f" a task that names none runs in): add {self.runtime} to runtimes, or set runtime"
                f" to one of them"
            )
        return self

    @property
    def offered_runtimes(self) -> tuple[str, ...]:
        """The runtimes a task of this pool may name, `runtime` first."""
        return tuple(dict.fromkeys([self.runtime, *(self.runtimes or ())]))

    @model_validator(mode="after")
    def _host_network_needs_tunnel(self) -> PoolConfig:
        if not self.host_network and not self.kubernetes.tunnel:
            raise ValueError(
                "hostNetwork: false needs kubernetes.tunnel: true: nothing outside the cluster"
                " can dial a pod address, so without the tunnel the controlplane cannot reach"
                " the worker"
            )
        return self
