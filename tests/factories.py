"""Factories shared by the tests: the spec's values block, keys, values files, free ports."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import functools
import json
import os
import random
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from levers9.core.manifests import WorkerJobSpec
from levers9.devstack import values as devvalues
from levers9.rpc.worker_tls import worker_ca
from sandbox import pki
from sandbox.cluster.cluster import Cluster
from sandbox.scenario import NodeSpec

MARKER = "MARKER-5f3c9e-never-log-me"
"""Put inside secrets; no log, dump or error may ever contain it."""


@functools.cache
def authority() -> pki.CertificateAuthority:
    return pki.mint_certificate_authority()


@functools.cache
def _key() -> dict[str, str]:
    key = pki.mint_service_account_key(
        project="demo", account="levers9-controlplane", token_uri="https://127.0.0.1:6443/token"
    )
    key["marker"] = MARKER
    return key


def service_account_key() -> dict[str, str]:
    """A real service-account key that carries MARKER."""
    return dict(_key())


def key_json() -> str:
    return pki.service_account_key_json(service_account_key())


def spec_pool(**kubernetes: Any) -> dict[str, Any]:
    """The spec's `gke-rtx6000` block, with a real CA, overrides under `kubernetes:`."""
    block = devvalues.pool_block(authority().ca_base64, "https://34.118.0.10")
    block["kubernetes"].update(kubernetes)
    return block


def values_doc(pools: dict[str, Any], controlplane: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"config": {"worker": {"pools": copy.deepcopy(pools)}}}
    if controlplane is not None:
        doc["config"]["controlplane"] = controlplane
    return doc


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def private_values(pool_name: str = "gke-rtx6000") -> dict[str, Any]:
    """The spec's private values file: only the key, under the pool."""
    return values_doc({pool_name: {"kubernetes": {"credentials": key_json()}}})


# Ports for servers a test starts on a port of its choosing: below the kernel's ephemeral range
# (32768+, where every `bind(0)` and outgoing connection lands), one block per pytest-xdist
# worker, never the same port twice in a process. Without this, two test processes (or a
# server binding port 0) could take the port between the probe and the server's own bind.
_PORT_BLOCK = 2500
_PORT_BASE = 20000
_handed_out: set[int] = set()


LEVERS9 = Path(sys.executable).parent / "levers9"
"""This environment's `levers9` CLI."""


async def run_levers9(
    env: Mapping[str, str], *args: str, within_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """`levers9 ARGS` in a process of its own with `env`, as a user runs it, off the event
    loop (the sandbox and the controlplane may be on it)."""
    return await asyncio.to_thread(
        subprocess.run,
        [str(LEVERS9), *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=within_s,
    )


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = int(worker.removeprefix("gw")) + 1 if worker.startswith("gw") else 0
    low = _PORT_BASE + (block % 5) * _PORT_BLOCK
    start = random.randrange(_PORT_BLOCK)
    for offset in range(_PORT_BLOCK):
        port = low + (start + offset) % _PORT_BLOCK
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{low + _PORT_BLOCK - 1}")


WORKER_CA_SECRET = "worker-ca-secret-for-tests"
"""The worker token secret whose CA issues the certificates of workers the tests start."""


def worker_tls(worker_id: str) -> tuple[str, str]:
    """A worker's serving certificate and key (PEM), as `create_worker_job` puts them in its
    Secret, issued by WORKER_CA_SECRET's CA."""
    issued = worker_ca(WORKER_CA_SECRET).issue(worker_id, dt.datetime.now(dt.UTC))
    return issued.cert_pem, issued.key_pem


def worker_job_spec(**overrides: Any) -> WorkerJobSpec:
    """A GKE pool's worker Job spec (the spec's defaults), with `overrides`."""
    fields: dict[str, Any] = {
        "pool_name": "gke-rtx6000",
        "worker_id": "a1b2c3d4",
        "node_name": "gke-gpu-4x-1",
        "gpus": 2,
        "image": "us-central1-docker.pkg.dev/demo/levers9/worker:latest",
        "namespace": "levers9",
        "gpu_taint": True,
        "host_network": True,
        "tunnel": False,
        "images_path": "/var/lib/levers9/images",
        "durable_disks_path": "/var/lib/levers9/disks",
        "gateway_address": "203.0.113.10:7443",
        "worker_cpu_millis": 500,
        "worker_memory_bytes": 1 << 30,
    }
    return WorkerJobSpec(**{**fields, **overrides})


async def add_gpu_node(
    cluster: Cluster, name: str, gpus: int, internal_ip: str, external_ip: str
) -> None:
    """A GPU node like the scenario's first, with its own name, `gpus` cards and addresses."""
    base = cluster.node_specs()[0].model_dump()
    spec = {**base, "name": name, "internal_ip": internal_ip, "external_ip": external_ip}
    await cluster.add_node(NodeSpec.model_validate({**spec, "gpus": {"count": gpus}}))


SERVE_H = (
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.ThreadingHTTPServer((os.environ['LEVERS9_HOST'], int(os.environ['PORT'])),"
    " H).serve_forever()\n"
)
"""The end of a task's HTTP server script: handler class H without an access log, served on
the task's published port (`$LEVERS9_HOST:$PORT`)."""
HTTP_TASK = (
    "import http.server, os, time\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def do_GET(self):\n"
    "        if self.path.startswith('/slow'):\n"
    "            time.sleep(float(self.path.partition('=')[2] or 1))\n"
    "        if self.path == '/die':\n"
    "            os._exit(3)\n"
    "        if self.path == '/half':\n"
    "            self.send_response(200)\n"
    "            self.send_header('Content-Length', '1000')\n"
    "            self.end_headers()\n"
    "            self.wfile.write(b'x' * 10)\n"
    "            self.wfile.flush()\n"
    "            os._exit(3)\n"
    "        if self.path == '/env':\n"
    "            body = os.environ.get('VLLM_ATTENTION_BACKEND', '-').encode()\n"
    "        else:\n"
    "            body = f'hello from {os.environ[\"LEVERS9_TASK_ID\"]} {self.path}'.encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n" + SERVE_H
)
"""A task that serves HTTP on `$LEVERS9_HOST:$PORT` (its published port): `/slow?s=N` answers
after N s, `/die` exits before answering, `/half` dies mid-body, `/env` shows
VLLM_ATTENTION_BACKEND, anything else `hello from <task id> <path>`."""
