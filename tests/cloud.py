"""The cloud around a sandbox cluster, for the cloud-side tests: the sandbox (its Kubernetes API
and its GCP APIs), two real registries (the controlplane's ECR and the project's Artifact
Registry), moto seeded as the controlplane's AWS (EKS nodes with public IPs, a NAT gateway),
the worker image pushed into the first, and the environment a user's shell has after
`. .levers9/dev/env` (what `levers9 gke attach` and the scripts read).

The controlplane's egress IP is the first EKS node's public IP, and the cluster's authorized
networks start without it (only `198.51.100.0/24`, someone's office): until attach runs, the
Kubernetes API answers the controlplane with 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sandbox import aws, registries, worker_image
from sandbox.gcp.env import cloud_env
from sandbox.scenario import Scenario
from sandbox.serve import RunningSandbox, start
from tests.controlplane import quick_scenario

BIN = Path(sys.executable).parent
OFFICE = "198.51.100.0/24"
OFFICE_IP = "198.51.100.10"
GAR_HOST = "us-central1-docker.pkg.dev"


@dataclass
class CloudWorld:
    running: RunningSandbox
    ecr: registries.LocalRegistry
    gar: registries.LocalRegistry
    moto: aws.LocalMoto
    seeded: aws.ControlplaneAws
    key_file: Path
    env: dict[str, str]

    @property
    def project(self) -> str:
        return self.running.cluster.scenario.cluster.project

    @property
    def cluster(self) -> str:
        return self.running.cluster.scenario.cluster.name

    @property
    def location(self) -> str:
        return self.running.cluster.scenario.cluster.location

    def authorized_networks(self) -> list[str]:
        networks = self.running.sandbox.policy.authorized_networks or []
        return [str(n) for n in networks]

    def set_egress_ip(self, ip: str) -> None:
        self.running.sandbox.policy.egress_ip = ip

    async def attach(self, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """`deploy/gke/attach-gke-pool.sh` as a user runs it; (exit code, stdout, stderr)."""
        script = Path(__file__).parents[1] / "deploy" / "gke" / "attach-gke-pool.sh"
        args = ["--project", self.project, "--zone", self.location, "--cluster", self.cluster]
        args += ["--node-pool", "gpu-4x", "--gpu", "RTXPro6000", *extra]
        return await run(str(script), *args, env=env or self.env)

    async def levers9(self, *args: str) -> tuple[int, str, str]:
        return await run(str(BIN / "levers9"), *args, env=self.env)


async def run(*argv: str, env: dict[str, str], within: float = 180) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), within)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def cloud_world(
    directory: Path, temporal_address: str, task_queue: str, scenario: Scenario | None = None
) -> AsyncIterator[CloudWorld]:
    ecr = registries.LocalRegistry(directory / "ecr").start()
    gar = registries.LocalRegistry(directory / "gar").start()
    moto = aws.LocalMoto(directory / "moto.log").start()
    running: RunningSandbox | None = None
    try:
        image = await asyncio.to_thread(worker_image.build, directory / "image")
        await asyncio.to_thread(worker_image.push, image, ecr.address)
        seeded = await asyncio.to_thread(aws.seed, moto.endpoint)
        base = (scenario or quick_scenario()).with_registry_mirrors({GAR_HOST: gar.address})
        running = await start(base, directory / "sandbox")
        running.sandbox.policy.egress_ip = seeded.node_ips[0]
        running.sandbox.policy.set_authorized_networks([OFFICE])
        running.sandbox.policy.workstation_ip = OFFICE_IP  # the admin's kubectl, in the office
        key_file = directory / "home" / ".levers9" / "gke-sa.json"
        env = {
            **os.environ,
            **cloud_env(directory / "sandbox"),
            **aws.client_env(moto.endpoint),
            "HOME": str(directory / "home"),
            "TEMPORAL_ADDRESS": temporal_address,
            "LEVERS9_TASK_QUEUE": task_queue,
            "LEVERS9_EKS_CLUSTER": aws.CLUSTER,
            "LEVERS9_SOURCE_IMAGE": f"{ecr.address}/levers9/worker:latest",
            "LEVERS9_REGISTRY_MIRRORS": f"{GAR_HOST}={gar.address}",
            "LEVERS9_INSECURE_REGISTRIES": f"{ecr.address},{gar.address}",
            "LEVERS9_GKE_KEY_FILE": str(key_file),
            "LEVERS9": str(BIN / "levers9"),
            "LEVERS9_HOME": str(directory / "no-dev-stack"),
        }
        yield CloudWorld(running, ecr, gar, moto, seeded, key_file, env)
    finally:
        if running is not None:
            await running.close()
        moto.stop()
        gar.stop()
        ecr.stop()
