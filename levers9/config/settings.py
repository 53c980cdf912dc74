"""Controlplane settings: `config.controlplane` in values, overridden by the environment
(`ControlplaneSettings`). Secrets are `SecretStr`; token files are read when asked for."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from levers9.contract import host_list, registry_mirrors
from levers9.tokens import operator_token


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
    temporal_ui_url: str = Field(
        default="",
        validation_alias=AliasChoices("temporalUiUrl", "LEVERS9_TEMPORAL_UI_URL"),
    )
    """The Temporal UI's base URL (e.g. `https://cloud.temporal.io` or the dev server's
    `http://127.0.0.1:8233`): the dashboard links each task, endpoint, workspace and box to
    `<temporalUiUrl>/namespaces/<namespace>/workflows/<workflow id>`. Empty: no links."""
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
    volume_key_generation: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices("volumeKeyGeneration", "LEVERS9_VOLUME_KEY_GENERATION"),
    )
    """The key generation new volumes' credentials are sealed under (levers9.sealed); a
    volume's record keeps its own, so older volumes still open."""
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

    @field_validator("temporal_ui_url")
    @classmethod
    def _temporal_ui_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            return ""
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"temporalUiUrl: {value!r} is not an http(s) URL; give the Temporal UI's base"
                " URL, e.g. http://127.0.0.1:8233 (empty: no links)"
            )
        return value

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
