"""The values block: `config.worker.pools.<name>` as pydantic models, loaded like `helm -f`.

Values files (YAML or JSON) merge in order, maps deeply, later wins, `null` deletes a key, so
the spec's private credentials file merges into the pool block it completes. A pool that does
not validate is not loaded; the others are (a controlplane with one broken pool still serves
the rest). Every error names its field path, e.g.
`config.worker.pools.gke-rtx6000.kubernetes.caCertificate: not a base64 PEM certificate`.

Secrets (`credentials`, the worker token secret) are `SecretStr`: they never appear in a repr,
a dump, a log line or an error message (`hide_input_in_errors`).

No I/O at import time; `load_values` and `credentialsFile` read files when called.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from levers9.contract import DNS_LABEL, host_list, label_problem, registry_mirrors
from levers9.tokens import operator_token

POOLS_PATH = ("config", "worker", "pools")
CONTROLPLANE_PATH = ("config", "controlplane")
PROVIDER = "kubernetes"
INVALID_PROVIDER = "invalid provider name"

_POOL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_SA_KEY_FIELDS = ("client_email", "private_key", "token_uri")


class ConfigError(Exception):
    """Values that cannot be used; `errors` are `<field path>: <what is wrong>` lines."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


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


def _check_service_account_key(text: str) -> None:
    try:
        key = json.loads(text)
    except (ValueError, RecursionError):
        key = None
    missing = [] if isinstance(key, dict) else list(_SA_KEY_FIELDS)
    if isinstance(key, dict):
        if key.get("type") != "service_account":
            missing.append("type=service_account")
        missing += [f for f in _SA_KEY_FIELDS if not isinstance(key.get(f), str) or not key[f]]
        private_key = key.get("private_key")
        if isinstance(private_key, str) and "PRIVATE KEY-----" not in private_key:
            missing.append("a PEM private_key")
    if missing:
        raise ValueError(
            "not a service-account key: expected the JSON key file of a Google service account"
            f" (missing {', '.join(missing)}); attach-gke-pool.sh writes it to"
            " ~/.levers9/gke-sa.json"
        )


def generic_kubeconfig(text: str) -> dict[str, Any] | None:
    """flavor generic's credentials as a kubeconfig (YAML, or JSON on one line or many); None
    when they are a bearer token. ValueError when they look like a document but are not one."""
    if not (text.lstrip().startswith("{") or "\n" in text.strip()):
        return None
    import yaml

    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and doc.get("kind") == "Config"):
        raise ValueError(
            "for flavor generic, credentials is a bearer token (one line) or a kubeconfig"
            " (kind: Config)"
        )
    return doc


def _check_generic_credentials(text: str) -> None:
    generic_kubeconfig(text)


class KubernetesConfig(_Model):
    """How the controlplane reaches the cluster, and what the worker Job looks like there."""

    flavor: Literal["gke", "generic"] = "gke"
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
        if self.flavor == "gke":
            if self.credentials is None and self.credentials_file is None:
                raise ValueError(
                    "flavor gke needs credentials (the service-account key, from a private"
                    " values file) or credentialsFile"
                )
            if self.ca_certificate is None:
                raise ValueError("flavor gke needs caCertificate (the cluster's CA, base64 PEM)")
        secret = self.credentials
        if self.credentials_file is not None:
            secret = SecretStr(_read_credentials_file(self.credentials_file))
        if secret is not None:
            check = (
                _check_service_account_key if self.flavor == "gke" else _check_generic_credentials
            )
            check(secret.get_secret_value())
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
    from levers9.quantity import parse_quantity

    if parse_quantity(value) <= 0:
        raise ValueError(f"{value!r} is not more than 0")
    return value


class TaskDefaults(_Model):
    """What a task gets when `levers9 run` does not say: its image, memory and CPU limits.

    Without an `image` here, a task given no `--image` runs as a process of the worker (its
    image's filesystem, not isolated from the agent), as before containers; set one."""

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
        from levers9.image_reference import ImageReference, ImageReferenceError

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
        from levers9.models import memory_floor_problem
        from levers9.quantity import whole

        below = memory_floor_problem(whole(value)) if value is not None else None
        if below is not None:
            raise ValueError(below)
        return value

    @property
    def memory_bytes(self) -> int:
        from levers9.quantity import whole

        return whole(self.memory) if self.memory else 0

    @property
    def cpu_millis(self) -> int:
        from levers9.quantity import millicores

        return millicores(self.cpus) if self.cpus else 0


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
        from levers9.quantity import millicores

        return millicores(self.cpu)

    @property
    def memory_bytes(self) -> int:
        from levers9.quantity import whole

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
    task_defaults: TaskDefaults = Field(default_factory=TaskDefaults, alias="taskDefaults")
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
        from levers9.quantity import whole

        return whole(self.image_cache_size)

    @field_validator("images_path", "durable_disks_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute():
            raise ValueError("must be an absolute path on the node (COS keeps / read-only)")
        return value

    @model_validator(mode="after")
    def _host_network_needs_tunnel(self) -> PoolConfig:
        if not self.host_network and not self.kubernetes.tunnel:
            raise ValueError(
                "hostNetwork: false needs kubernetes.tunnel: true: nothing outside the cluster"
                " can dial a pod address, so without the tunnel the controlplane cannot reach"
                " the worker"
            )
        return self


class ControlplaneSettings(BaseSettings):
    """Controlplane settings: `config.controlplane` in values, overridden by the environment.

    Environment names are `LEVERS9_<FIELD>` (e.g. `LEVERS9_RECONCILE_INTERVAL_SECONDS`), and the
    Temporal CLI's own `TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, so one
    sourced env file serves both `temporal` and `levers9`.
    """

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        hide_input_in_errors=True,
        case_sensitive=False,
    )

    temporal_address: str = Field(
        default="127.0.0.1:7233",
        validation_alias=AliasChoices(
            "temporalAddress", "LEVERS9_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"
        ),
    )
    temporal_namespace: str = Field(
        default="default",
        validation_alias=AliasChoices(
            "temporalNamespace", "LEVERS9_TEMPORAL_NAMESPACE", "TEMPORAL_NAMESPACE"
        ),
    )
    temporal_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "temporalApiKey", "LEVERS9_TEMPORAL_API_KEY", "TEMPORAL_API_KEY"
        ),
    )
    temporal_tls: bool = Field(
        default=False, validation_alias=AliasChoices("temporalTls", "LEVERS9_TEMPORAL_TLS")
    )
    temporal_tls_cert_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("temporalTlsCertFile", "LEVERS9_TEMPORAL_TLS_CERT_FILE"),
    )
    temporal_tls_key_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("temporalTlsKeyFile", "LEVERS9_TEMPORAL_TLS_KEY_FILE"),
    )
    temporal_tls_server_ca_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "temporalTlsServerCaFile", "LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE"
        ),
    )
    task_queue: str = Field(
        default="levers9-controlplane",
        min_length=1,
        validation_alias=AliasChoices("taskQueue", "LEVERS9_TASK_QUEUE"),
    )
    reconcile_interval_seconds: float = Field(
        default=15.0,
        gt=0,
        validation_alias=AliasChoices(
            "reconcileIntervalSeconds", "LEVERS9_RECONCILE_INTERVAL_SECONDS"
        ),
    )
    worker_idle_minutes: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("workerIdleMinutes", "LEVERS9_WORKER_IDLE_MINUTES"),
    )
    worker_record_ttl_minutes: float = Field(
        default=10.0,
        gt=0,
        validation_alias=AliasChoices(
            "workerRecordTtlMinutes", "LEVERS9_WORKER_RECORD_TTL_MINUTES"
        ),
    )
    gateway_listen: str = Field(
        default="127.0.0.1:7443",
        validation_alias=AliasChoices("gatewayListen", "LEVERS9_GATEWAY_LISTEN"),
    )
    gateway_advertised_address: str = Field(
        default="127.0.0.1:7443",
        validation_alias=AliasChoices(
            "gatewayAdvertisedAddress", "LEVERS9_GATEWAY_ADVERTISED_ADDRESS"
        ),
    )
    endpoints_listen: str = Field(
        default="127.0.0.1:7480",
        validation_alias=AliasChoices("endpointsListen", "LEVERS9_ENDPOINTS_LISTEN"),
    )
    """Where the endpoints' HTTP front listens (`levers9 endpoint create`); HTTPS with the
    gateway's certificate when it has one."""
    endpoints_url: str | None = Field(
        default=None, validation_alias=AliasChoices("endpointsUrl", "LEVERS9_ENDPOINTS_URL")
    )
    """The endpoints' base URL as users reach it (a load balancer's); `endpoint create` prints
    `<endpointsUrl>/<name>/`. Unset: from endpointsListen and the gateway's TLS."""
    endpoints_idle_timeout_seconds: float = Field(
        default=75.0,
        gt=0,
        validation_alias=AliasChoices(
            "endpointsIdleTimeoutSeconds", "LEVERS9_ENDPOINTS_IDLE_TIMEOUT_SECONDS"
        ),
    )
    """A client's kept-alive connection to the endpoints' front that carries no request for
    this long is closed. Behind a load balancer that keeps its own connections to the front
    (Google's external Application Load Balancer keeps them 600 s), set it above the
    balancer's, or the balancer may send a request on a connection the front is closing."""
    endpoints_header_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        validation_alias=AliasChoices(
            "endpointsHeaderTimeoutSeconds", "LEVERS9_ENDPOINTS_HEADER_TIMEOUT_SECONDS"
        ),
    )
    """A request's line and headers arrive whole within this (from the connection, or on a
    kept-alive one from the request's first byte), or the front answers 408 and closes: a
    client that sends them slowly cannot hold the front's connections (Slowloris)."""
    endpoints_max_body_bytes: int = Field(
        default=100 * 1024 * 1024,
        gt=0,
        validation_alias=AliasChoices("endpointsMaxBodyBytes", "LEVERS9_ENDPOINTS_MAX_BODY_BYTES"),
    )
    """The largest request body the front passes to a replica (100 MiB): a larger one is 413,
    by its Content-Length before any of it is read, or once a chunked one goes past it."""
    gateway_tls: bool = Field(
        default=False, validation_alias=AliasChoices("gatewayTls", "LEVERS9_GATEWAY_TLS")
    )
    """Dial the gateway with TLS (the CLI, and the workers through their Job's environment);
    on by itself when any gatewayTls file is set."""
    gateway_tls_cert_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("gatewayTlsCertFile", "LEVERS9_GATEWAY_TLS_CERT_FILE"),
    )
    """The gateway's certificate (chain, PEM): with gatewayTlsKeyFile, the gateway serves TLS."""
    gateway_tls_key_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("gatewayTlsKeyFile", "LEVERS9_GATEWAY_TLS_KEY_FILE"),
    )
    gateway_tls_ca_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("gatewayTlsCaFile", "LEVERS9_GATEWAY_TLS_CA_FILE"),
    )
    """The CA that issued the gateway's certificate, trusted by workers and the CLI; the
    system's roots when unset (a publicly trusted certificate)."""
    replica_id: str = Field(
        default_factory=socket.gethostname,
        validation_alias=AliasChoices("replicaId", "LEVERS9_REPLICA_ID"),
    )
    """This controlplane replica's name (its pod's; stable across restarts in dev): its own
    task queue `<taskQueue>-replica-<id>` serves the workers whose tunnels it holds."""
    replica_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("replicaAddress", "LEVERS9_REPLICA_ADDRESS"),
    )
    """host:port where the other replicas reach this replica's gateway (the chart sets the
    pod's IP): a stream to a tunnelled worker (logs, exec) that reaches another replica is
    relayed through this one, which holds the worker's session. Unset: gatewayListen, unless
    it listens on every address."""
    gcp_endpoint: str | None = Field(
        default=None, validation_alias=AliasChoices("gcpEndpoint", "LEVERS9_GCP_ENDPOINT")
    )
    """One endpoint for every Google Cloud API (an emulator); Google's own when unset."""
    source_image: str | None = Field(
        default=None, validation_alias=AliasChoices("sourceImage", "LEVERS9_SOURCE_IMAGE")
    )
    """The worker image in the controlplane's ECR, which attach and recopy copy from."""
    eks_cluster: str = Field(
        default="levers9-controlplane",
        validation_alias=AliasChoices("eksCluster", "LEVERS9_EKS_CLUSTER"),
    )
    registry_mirrors: str = Field(
        default="", validation_alias=AliasChoices("registryMirrors", "LEVERS9_REGISTRY_MIRRORS")
    )
    """`host=host:port,...`: where an image reference's registry really answers."""
    insecure_registries: str = Field(
        default="",
        validation_alias=AliasChoices("insecureRegistries", "LEVERS9_INSECURE_REGISTRIES"),
    )
    """Comma-separated `host:port`s spoken to without TLS (loopback registries only)."""
    gateway_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("gatewayAddress", "LEVERS9_GATEWAY_ADDRESS"),
    )
    """Where the CLI reaches the gateway; the advertised address when unset."""
    api_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("apiToken", "LEVERS9_API_TOKEN")
    )
    api_token_file: Path | None = Field(
        default=None, validation_alias=AliasChoices("apiTokenFile", "LEVERS9_API_TOKEN_FILE")
    )
    operator_token_generation: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices(
            "operatorTokenGeneration", "LEVERS9_OPERATOR_TOKEN_GENERATION"
        ),
    )
    """Raise by one to rotate the operator token alone (the CLI's; no worker is touched)."""
    worker_token_generation: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices("workerTokenGeneration", "LEVERS9_WORKER_TOKEN_GENERATION"),
    )
    """Raise by one to rotate every worker's token and command token alone (running workers
    are replaced; the operator token and the worker CA stay)."""
    worker_ca_generation: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices("workerCaGeneration", "LEVERS9_WORKER_CA_GENERATION"),
    )
    """Raise by one to rotate the worker CA alone (running workers are replaced)."""
    worker_token_secret: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("workerTokenSecret", "LEVERS9_WORKER_TOKEN_SECRET"),
    )
    worker_token_secret_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("workerTokenSecretFile", "LEVERS9_WORKER_TOKEN_SECRET_FILE"),
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment beats the values file (twelve-factor).
        return env_settings, init_settings

    @model_validator(mode="after")
    def _one_token_secret(self) -> ControlplaneSettings:
        if self.worker_token_secret is not None and self.worker_token_secret_file is not None:
            raise ValueError("set either workerTokenSecret or workerTokenSecretFile, not both")
        if self.temporal_tls_key_file is not None and self.temporal_tls_cert_file is None:
            raise ValueError("temporalTlsKeyFile needs temporalTlsCertFile (mTLS uses both)")
        if (self.gateway_tls_cert_file is None) != (self.gateway_tls_key_file is None):
            raise ValueError(
                "gatewayTlsCertFile and gatewayTlsKeyFile go together (the gateway serves TLS"
                " with both)"
            )
        return self

    def token_secret(self) -> SecretStr | None:
        """The secret that signs worker tokens, inline or read from its file."""
        if self.worker_token_secret_file is not None:
            return SecretStr(self.worker_token_secret_file.expanduser().read_text().strip())
        return self.worker_token_secret

    def operator_token(self) -> SecretStr | None:
        """The CLI's token for the gateway: given, read from its file, or (on the
        controlplane's own machine) derived from the worker token secret."""
        if self.api_token is not None:
            return self.api_token
        if self.api_token_file is not None:
            return SecretStr(self.api_token_file.expanduser().read_text().strip())
        secret = self.token_secret()
        if secret is None:
            return None
        return SecretStr(operator_token(secret.get_secret_value(), self.operator_token_generation))

    def mirrors(self) -> dict[str, str]:
        """`registry_mirrors` parsed; a malformed entry names the setting and the form."""
        return registry_mirrors(self.registry_mirrors)

    def insecure(self) -> frozenset[str]:
        return host_list(self.insecure_registries)

    @property
    def replica_task_queue(self) -> str:
        return f"{self.task_queue}-replica-{self.replica_id}"

    def replica_gateway(self) -> str | None:
        """Where the other replicas reach this one's gateway (`replicaAddress`)."""
        if self.replica_address:
            return self.replica_address
        host = self.gateway_listen.rpartition(":")[0].strip("[]")
        return None if host in ("", "0.0.0.0", "::") else self.gateway_listen

    def endpoints_base_url(self) -> str:
        if self.endpoints_url:
            return self.endpoints_url.rstrip("/")
        tls = self.gateway_tls_cert_file is not None or self.gateway_tls
        return f"{'https' if tls else 'http'}://{self.endpoints_listen}"

    def cli_gateway_address(self) -> str:
        return self.gateway_address or self.gateway_advertised_address

    def gateway_uses_tls(self) -> bool:
        files = (self.gateway_tls_cert_file, self.gateway_tls_ca_file)
        return self.gateway_tls or any(f is not None for f in files)


@dataclass(frozen=True)
class PoolProblem:
    """A pool that did not load: `error` is the spec's `error=` value."""

    pool_name: str
    error: str


@dataclass(frozen=True)
class Values:
    """Everything the values files say, validated."""

    pools: Mapping[str, PoolConfig]
    problems: Sequence[PoolProblem]
    settings: ControlplaneSettings


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merges like helm: maps deeply, anything else replaced, `null` deletes the key."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_values_file(path: Path) -> dict[str, Any]:
    """One values file (YAML, which JSON is a subset of) as a map."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{path}: not UTF-8 text (byte {exc.start}): values files are YAML or JSON"]
        ) from None
    import yaml  # values files only: the CLI's settings come from the environment

    try:
        doc = yaml.load(text, Loader=_values_loader())
    except DuplicateKey as exc:
        raise ConfigError([f"{path}: {exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError([f"{path}: not valid YAML or JSON{where}"]) from None
    except RecursionError:
        doc = _TOO_DEEP
    if doc is _TOO_DEEP or _depth(doc) > MAX_DEPTH:
        raise ConfigError(
            [
                f"{path}: nested more than {MAX_DEPTH} deep: values are a few maps deep (config:"
                " worker: pools: <name>: ...)"
            ]
        )
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([f"{path}: the top level must be a map (config: ...)"])
    return doc


MAX_DEPTH = 64
"""The deepest a values document may nest (maps and lists): the pool block is six deep; a
deeper document is refused before anything recurses into it."""
_TOO_DEEP = object()


def _depth(doc: Any) -> int:
    """How deep maps and lists nest in `doc`, counted without recursion (stops past
    MAX_DEPTH)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(node, Mapping):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


class DuplicateKey(Exception):
    """A YAML map that holds a key twice (YAML forbids it; PyYAML would keep the last)."""


def _values_loader() -> type:
    """yaml.SafeLoader, refusing a key written twice in one map, naming it and both lines."""
    import yaml

    class ValuesLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<:` merges; keys written beside it override, as YAML says
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: the constructor refuses it below
                    if first is not None:
                        raise DuplicateKey(
                            f"key {key!r:.80} is written twice in one map (lines {first} and"
                            f" {line}): keep one (YAML keeps no duplicate; the last would win)"
                        )
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return ValuesLoader


def load_values(paths: Iterable[Path]) -> dict[str, Any]:
    """Reads and merges values files in order, like `helm -f a -f b`."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge_values(merged, read_values_file(path))
    return merged


def _dig(doc: Mapping[str, Any], path: Sequence[str]) -> tuple[Any, str | None]:
    node: Any = doc
    for depth, key in enumerate(path):
        if node is None:
            return None, None
        if not isinstance(node, Mapping):
            return None, f"{'.'.join(path[:depth])}: must be a map"
        node = node.get(key)
    if node is not None and not isinstance(node, Mapping):
        return None, f"{'.'.join(path)}: must be a map"
    return node, None


def describe_validation_error(prefix: str, error: ValidationError) -> list[str]:
    """`<prefix>.<field path>: <message>` for each error, without the offending input."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in item["loc"])
        path = f"{prefix}.{loc}" if loc else prefix
        message = item["msg"]
        if item["type"] == "value_error":
            message = str(item.get("ctx", {}).get("error", message))
        elif item["type"] == "missing":
            message = "required"
        elif item["type"] == "extra_forbidden":
            message = "unknown field (check its spelling against docs/configuration.md)"
        lines.append(f"{path}: {message}")
    return lines


def joined_pool(name: str, block: Any) -> PoolConfig:
    """A joined cluster's pool (`levers9.clusters.pool_block`)."""
    pool = parse_pool(name, block)
    pool.kubernetes._joined = True
    return pool


def parse_pool(name: str, block: Any) -> PoolConfig:
    """Validates one pool block; raises ConfigError naming the field on bad input."""
    prefix = ".".join((*POOLS_PATH, name))
    if not _POOL_NAME.match(name):
        raise ConfigError(
            [f"{prefix}: a pool name is lowercase letters, digits and '-', at most 40 long"]
        )
    if not isinstance(block, Mapping):
        raise ConfigError([f"{prefix}: must be a map"])
    if block.get("provider") != PROVIDER:
        kube = block.get("kubernetes")
        only_credentials = (
            set(block) == {"kubernetes"}
            and isinstance(kube, Mapping)
            and bool(kube)
            and set(kube) <= {"credentials", "credentialsFile"}
        )
        if only_credentials:
            # The spec's line, and why: a private values file for a pool of another name.
            raise ConfigError(
                [
                    INVALID_PROVIDER,
                    f"{prefix}: only credentials here: a private values file names a pool"
                    " the other values files do not have (check the pool's name in both)",
                ]
            )
        if block.get("provider") is None:
            # `{}`, or a block that lost its first lines: say where (another provider's pool
            # is the spec's line alone: it belongs to another part of the controlplane).
            raise ConfigError(
                [INVALID_PROVIDER, f"{prefix}.provider: required: write provider: {PROVIDER}"]
            )
        raise ConfigError([INVALID_PROVIDER])
    try:
        return PoolConfig.model_validate(block)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(prefix, exc)) from None


def parse_settings(doc: Mapping[str, Any]) -> ControlplaneSettings:
    """Controlplane settings from `config.controlplane`, overridden by the environment."""
    block, problem = _dig(doc, CONTROLPLANE_PATH)
    if problem:
        raise ConfigError([problem])
    try:
        return ControlplaneSettings(**dict(block or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(".".join(CONTROLPLANE_PATH), exc)) from None


KNOWN_ABOVE_POOLS: Mapping[tuple[str, ...], frozenset[str]] = {
    ("config",): frozenset({"controlplane", "worker"}),
    ("config", "worker"): frozenset({"pools"}),
}
"""What `config` and `config.worker` hold; anything else there is a typo (`config.wrker`).
Keys beside `config` are the Helm chart's own (`replicaCount`, `image`, ...) and pass."""


def _unknown_above_pools(doc: Mapping[str, Any]) -> list[str]:
    problems = []
    for path, known in KNOWN_ABOVE_POOLS.items():
        block, _ = _dig(doc, path)
        for key in block or {}:
            if key not in known:
                problems.append(
                    f"{'.'.join(path)}.{key}: unknown field (check its spelling against"
                    f" docs/configuration.md; {'.'.join(path)} holds {', '.join(sorted(known))})"
                )
    return problems


def parse_values(doc: Mapping[str, Any]) -> Values:
    """Validates merged values: pools that load, pools that do not, controlplane settings."""
    unknown = _unknown_above_pools(doc)
    if unknown:
        raise ConfigError(unknown)
    settings = parse_settings(doc)
    block, problem = _dig(doc, POOLS_PATH)
    if problem:
        raise ConfigError([problem])
    pools: dict[str, PoolConfig] = {}
    problems: list[PoolProblem] = []
    for name, pool_block in (block or {}).items():
        try:
            pools[str(name)] = parse_pool(str(name), pool_block)
        except ConfigError as exc:
            problems += [PoolProblem(str(name), line) for line in exc.errors]
    return Values(pools=pools, problems=problems, settings=settings)


def load(paths: Sequence[Path]) -> Values:
    """Loads values files (merged in order) into validated pools and settings."""
    return parse_values(load_values(paths))
