"""The worker's environment contract: what the worker Job (`levers9.core.manifests.worker_job`) and
its token Secret put in the container's environment, read once at start.

| variable | meaning |
| - | - |
| `LEVERS9_GATEWAY_ADDRESS` | host:port of the gateway the worker dials (required) |
| `LEVERS9_POOL_NAME`, `LEVERS9_WORKER_ID` | who this worker is (required) |
| `LEVERS9_WORKER_TOKEN` | the worker's token, from its Secret (required) |
| `LEVERS9_POD_UID` | finds this pod's cards in the kubelet checkpoint |
| `LEVERS9_NODE_NAME` | reported to the gateway; never advertised as an address |
| `LEVERS9_ADVERTISED_HOST` | the node's external IP, advertised for WorkerService |
| `LEVERS9_HOST_IP` | the node's address (downward API), when no external IP was given |
| `LEVERS9_WORKER_PORT` | WorkerService's port; ephemeral when unset (workers share nodes) |
| `LEVERS9_GPUS` | cards the Job asked for; `0` needs no checkpoint (optional) |
| `LEVERS9_GPU_PRODUCT` | the card's name when `nvidia-smi` cannot tell (optional) |
| `LEVERS9_WORK_DIR` | tasks' output, results, runc state (a restarted agent adopts); else temp |
| `LEVERS9_TASK_NETWORK_ALLOW` | the pool's `taskNetwork.allow` (CIDRs, comma-separated) |
| `LEVERS9_TASK_SECCOMP_PROFILE` | the pool's `taskSeccompProfile`: a node path; else the default |
| `LEVERS9_IMAGE_CACHE_REPORT` | the pool's `cache.enabled`: heartbeats name the cached images |
| `LEVERS9_WORKER_IMAGE` | the Job's image: where a task without one runs (no taskDefaults.image) |
| `LEVERS9_RUNTIME` | the pool's `runtime`: `runc` (default) or `runsc` (see `runtimes`) |
| `LEVERS9_RUNTIMES` | the pool's `runtimes`: the others a task may name (`runc,runsc`) |
| `LEVERS9_TUNNEL` | the pool's `tunnel` setting: serve through one outbound stream to the gateway |
| `LEVERS9_GATEWAY_TLS` | dial the gateway with TLS (the controlplane's `gatewayTls`) |
| `LEVERS9_GATEWAY_CA` | the CA (PEM) trusted for the gateway; the system's roots when unset |
| `LEVERS9_WORKER_TLS_CERT` | WorkerService's certificate (PEM) from its Secret: TLS when set |
| `LEVERS9_WORKER_TLS_KEY` | its key (PEM), from the same Secret; unused in tunnel mode |
| `LEVERS9_LOG_LEVEL` | `INFO` unless set (read by `main`, before anything can fail) |

Plus the sandbox's `LEVERS9_SANDBOX_ROOT` and `LEVERS9_SANDBOX_MOUNTS` (see `paths`), and
`LEVERS9_PROCESS_TASKS`, the agent's tests' knob that no Job sets (no pool value can express it:
the sandbox kubelet adds it to a worker pod where its scenario's `images.processTasks` asks, a
test that starts an agent sets it itself): a task that names no image (and finds no default)
runs as a process of the agent, outside any container, and `LEVERS9_RUNTIME=process` is taken.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path

import grpc
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from levers9.agent.images import DEFAULT_MAX_BYTES
from levers9.agent.paths import HostPaths
from levers9.agent.runtime import TaskDefaults
from levers9.agent.task_network import Network as IPNetwork
from levers9.agent.task_network import parse_allow
from levers9.contract import (
    COMMAND_DIGEST_FILE,
    DEFAULT_RUNTIME,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    TOKEN_FILE,
    host_list,
    registry_mirrors,
)
from levers9.rpc import tls, worker_tls

PREFIX = "LEVERS9_"


class SettingsError(ValueError):
    """The environment does not describe a worker; the message names the variable."""


class WorkerSettings(BaseModel):
    """See module doc; field `x` is variable `LEVERS9_X`."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    gateway_address: str = Field(min_length=1)
    pool_name: str = Field(min_length=1)
    worker_id: str = Field(min_length=1)
    worker_token: SecretStr
    command_digest: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    """The SHA-256 of the controlplane's command token: WorkerService takes only calls whose
    `levers9-command-token` matches it. Empty (a Job of an older controlplane): calls are
    checked against the worker's own token, as before."""
    pod_uid: str = ""
    node_name: str = ""
    advertised_host: str = ""
    host_ip: str = ""
    pod_ip: str = ""
    worker_port: int = Field(default=0, ge=0, le=65535)
    gpus: int | None = Field(default=None, ge=0)
    gpu_product: str = ""
    work_dir: Path | None = None
    tunnel: bool = False
    gateway_tls: bool = False
    gateway_ca: str = ""
    worker_tls_cert: str = ""
    worker_tls_key: SecretStr = SecretStr("")
    images_path: str = ""
    """The node path of the image cache (the pool's `imagesPath`, a hostPath of the Job)."""
    image_cache_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=0)
    image_cache_report: bool = False
    """The pool's `cache.enabled`: heartbeats report the references the image cache holds."""
    durable_disks_path: str = ""
    """The node path of the durable disks (the pool's `durableDisksPath`, a hostPath of the
    Job): each disk an ext4 image file there (levers9.agent.disks); "": this worker keeps none."""
    registry_mirrors: str = ""
    insecure_registries: str = ""
    runtime: str = DEFAULT_RUNTIME
    """The pool's `runtime`: the name of what runs its tasks, checked by `runtimes.factory`."""
    runtimes: str = ""
    """The pool's `runtimes`, comma-separated: those its tasks may name (`runtime` among them);
    "": `runtime` only."""
    task_network_allow: str = ""
    """The pool's `taskNetwork.allow`, comma-separated: CIDRs its tasks may reach though private
    or link-local (`task_network.parse_allow`)."""
    task_seccomp_profile: str = ""
    """The pool's `taskSeccompProfile`: the node path of the seccomp profile its runc tasks run
    under ("": levers9.agent.seccomp's default)."""
    default_image: str = ""
    """The pool's `taskDefaults.image`: where a task that names no image runs."""
    worker_image: str = ""
    """The Job's own image: where a task runs that names no image when the pool sets no
    `taskDefaults.image` (its Entrypoint, the agent, is never a task's)."""
    process_tasks: bool = False
    """Tests only (see module doc): a task that names no image runs as a process of the agent."""
    default_memory_bytes: int = Field(default=0, ge=0)
    default_cpu_millis: int = Field(default=0, ge=0)

    def task_host(self) -> str:
        """Where the tasks' published ports are reached: the pod's IP (the node's own on the
        host network), as the containers share the worker's network."""
        return self.pod_ip or self.host_ip or "127.0.0.1"

    def offered_runtimes(self) -> tuple[str, ...]:
        """The runtimes a task of this pool may name, `runtime` first."""
        named = [n for n in (n.strip() for n in self.runtimes.split(",")) if n]
        return tuple(dict.fromkeys([self.runtime, *named]))

    def task_network_allowed(self) -> tuple[IPNetwork, ...]:
        """The CIDRs of `LEVERS9_TASK_NETWORK_ALLOW`; SettingsError naming it when one is not."""
        try:
            return parse_allow(self.task_network_allow, f"{PREFIX}TASK_NETWORK_ALLOW")
        except ValueError as error:
            raise SettingsError(str(error)) from None

    def task_defaults(self) -> TaskDefaults:
        """What a task gets where it names none: the pool's image, else the worker's own (none
        under the tests' process knob, which runs such a task as a process)."""
        image = self.default_image or ("" if self.process_tasks else self.worker_image)
        return TaskDefaults(
            image, self.default_memory_bytes, self.default_cpu_millis, self.worker_image
        )

    def mirrors(self) -> dict[str, str]:
        try:
            return registry_mirrors(self.registry_mirrors)
        except ValueError as error:
            raise SettingsError(str(error)) from None

    def insecure(self) -> frozenset[str]:
        return host_list(self.insecure_registries)

    @classmethod
    def from_env(cls, env: Mapping[str, str], paths: HostPaths | None = None) -> WorkerSettings:
        """Reads `LEVERS9_*`; empty values count as unset. The credentials come from the files
        of `LEVERS9_CREDENTIALS_DIR` (the Job's Secret volume) when it is set; a Job of an older
        controlplane passes them as variables. Raises SettingsError."""
        values: dict[str, str] = {
            name.lower(): env[PREFIX + name.upper()]
            for name in cls.model_fields
            if env.get(PREFIX + name.upper())
        }
        directory = env.get(PREFIX + "CREDENTIALS_DIR")
        if directory:
            values.update(_credentials(directory, paths or HostPaths()))
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" for e in error.errors()
            )
            raise SettingsError(f"the worker's environment is incomplete: {problems}") from None

    def gateway_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS to the gateway when the Job says so (a CA given implies it); SettingsError when
        the CA is not a PEM certificate."""
        if not (self.gateway_tls or self.gateway_ca):
            return None
        ca = self.gateway_ca.encode() or None
        try:
            return tls.channel_credentials(ca, f"{PREFIX}GATEWAY_CA")
        except tls.TlsError as error:
            raise SettingsError(str(error)) from None

    def worker_credentials(self) -> grpc.ServerCredentials | None:
        """WorkerService's TLS, from the certificate and key the worker's Secret carries; None
        without them (a Job of an older controlplane) or in tunnel mode (a unix socket only the
        tunnel reaches). SettingsError when they are not a certificate and its key."""
        if self.tunnel:
            return None
        key = self.worker_tls_key.get_secret_value()
        if not (self.worker_tls_cert or key):
            return None
        try:
            return worker_tls.server_credentials(self.worker_tls_cert, key, PREFIX)
        except tls.TlsError as error:
            raise SettingsError(str(error)) from None

    def address_to_advertise(self) -> str:
        """The IP the controlplane dials: the node's external IP, else the node's address.

        A name would have the controlplane resolve it (`dial tcp: lookup <node>`), so only an IP
        literal is accepted.
        """
        host = self.advertised_host or self.host_ip
        if not host:
            raise SettingsError(
                "neither LEVERS9_ADVERTISED_HOST nor LEVERS9_HOST_IP is set: the worker has no "
                "address the controlplane can dial"
            )
        try:
            ipaddress.ip_address(host)
        except ValueError:
            source = "LEVERS9_ADVERTISED_HOST" if self.advertised_host else "LEVERS9_HOST_IP"
            raise SettingsError(
                f"{source}={host} is not an IP address; the controlplane would have to resolve "
                "it (dial tcp: lookup ...): advertise the node's external IP"
            ) from None
        return host


_CREDENTIAL_FILES = {
    "worker_token": TOKEN_FILE,
    "command_digest": COMMAND_DIGEST_FILE,
    "worker_tls_cert": TLS_CERT_FILE,
    "worker_tls_key": TLS_KEY_FILE,
}


def _credentials(directory: str, paths: HostPaths) -> dict[str, str]:
    """The Secret's files: the token must be there; the command digest from a current
    controlplane (a Job of an older one has none); the TLS pair only without the tunnel."""
    found = {}
    for field, name in _CREDENTIAL_FILES.items():
        node_path = f"{directory.rstrip('/')}/{name}"
        try:
            found[field] = paths.map(node_path).read_text().strip()
        except FileNotFoundError:
            if field == "worker_token":
                raise SettingsError(
                    f"{node_path} is missing: the Job mounts the worker's token Secret there"
                ) from None
        except OSError as error:
            raise SettingsError(f"cannot read {node_path}: {error.strerror}") from None
    return found
