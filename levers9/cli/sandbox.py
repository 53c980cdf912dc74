"""`levers9 sandbox`: the local GKE-like cluster, in the foreground or as `dev up` runs it."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from levers9.cli.output import Output, console, fail, render
from levers9.devstack.processes import is_running
from levers9.devstack.stack import DevStack
from levers9.home import state_home
from sandbox.admin_client import SandboxAdmin, SandboxAdminError, SandboxUnavailable
from sandbox.scenario import Scenario

app = typer.Typer(help="The sandbox: a local GKE-like cluster kubectl and the client drive.")
node_app = typer.Typer(help="Scenario commands for nodes of a running sandbox.")
app.add_typer(node_app, name="node")

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="the sandbox's state directory (default: the dev stack's)"),
]
GKE_GPU_LABELS = {
    "cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000",
    "cloud.google.com/gke-os-distribution": "cos",
}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _state_dir(given: Path | None) -> Path:
    """--state-dir, else $LEVERS9_SANDBOX_STATE (the dev env file sets it), else the dev one."""
    from_env = os.environ.get("LEVERS9_SANDBOX_STATE")
    return given or (Path(from_env) if from_env else state_home() / "dev" / "sandbox")


def _admin(state_dir: Path | None) -> SandboxAdmin:
    try:
        return SandboxAdmin(_state_dir(state_dir))
    except SandboxUnavailable as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


def _run(action: Any) -> Any:
    try:
        return action()
    except (SandboxUnavailable, SandboxAdminError) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


@app.command()
def serve(
    scenario: Annotated[
        Path | None, typer.Option("--scenario", help="scenario YAML (default: the built-in one)")
    ] = None,
    port: Annotated[int, typer.Option("--port", help="API port on 127.0.0.1")] = 6443,
    state_dir: StateDir = None,
    controlplane_key: Annotated[
        Path | None,
        typer.Option("--controlplane-key", help="write (once) the controlplane's key here"),
    ] = None,
    registry_mirror: Annotated[
        list[str] | None,
        typer.Option(
            "--registry-mirror",
            help="HOST=127.0.0.1:PORT: images on HOST pull from the registry at that address",
        ),
    ] = None,
    process_image: Annotated[
        list[str] | None,
        typer.Option(
            "--process-image",
            help="REF=COMMAND: the kubelet runs this image's containers as local processes",
        ),
    ] = None,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh", help="start from the scenario, replacing the cluster saved in the state dir"
        ),
    ] = False,
) -> None:
    """Run the sandbox in the foreground until Ctrl-C; its cluster is saved on the way out (and
    every few seconds) and loaded on the next start."""
    from sandbox.persist import SnapshotError
    from sandbox.serve import serve as run

    try:
        loaded = Scenario.load(scenario)
    except (OSError, ValueError) as exc:
        fail([f"scenario {scenario}: {exc}"])
        raise typer.Exit(1) from None
    mirrors = dict(m.partition("=")[::2] for m in registry_mirror or [])
    try:
        loaded = loaded.with_registry_mirrors(mirrors)
    except ValueError as exc:
        fail([f"--registry-mirror: {exc}"])
        raise typer.Exit(1) from None
    processes = dict(p.rpartition("=")[::2] for p in process_image or [])
    if any(not ref or not command for ref, command in processes.items()):
        fail(["--process-image: give REF=COMMAND"])
        raise typer.Exit(1)
    loaded = loaded.with_process_images(processes)
    directory = _state_dir(state_dir)
    console.print(f"sandbox state in {directory}; kubectl --kubeconfig {directory / 'kubeconfig'}")
    try:
        asyncio.run(run(loaded, directory, port, controlplane_key, fresh=fresh))
    except SnapshotError as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


@node_app.command("list")
def node_list(
    state_dir: StateDir = None, output: Annotated[Output, typer.Option("-o")] = Output.table
) -> None:
    """The scenario's nodes as the sandbox runs them."""
    nodes = _run(_admin(state_dir).nodes)
    rows = [
        {
            "name": n["name"],
            "gpus": n["gpus"]["count"],
            "ready": n["ready"],
            "external_ip": n["externalIp"],
            "pool": n["labels"].get("cloud.google.com/gke-nodepool", ""),
        }
        for n in nodes
    ]
    columns = [("name", "NAME"), ("gpus", "GPUS"), ("ready", "READY"), ("pool", "NODE POOL")]
    render(rows, [*columns, ("external_ip", "EXTERNAL IP")], output, title="sandbox nodes")


def _next_ip(taken: set[str], network: str) -> str:
    for host in ipaddress.IPv4Network(network).hosts():
        if str(host) not in taken:
            return str(host)
    raise typer.BadParameter(f"no free address left in {network}")


@node_app.command("add")
def node_add(
    name: str,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="RTX PRO 6000 cards")] = 1,
    node_pool: Annotated[str, typer.Option("--node-pool")] = "gpu-extra",
    state_dir: StateDir = None,
) -> None:
    """A node joins the cluster (a GKE node pool scaled up)."""
    admin = _admin(state_dir)
    nodes = _run(admin.nodes)
    labels = {"cloud.google.com/gke-nodepool": node_pool}
    spec: dict[str, Any] = {"name": name, "labels": labels, "cpu": "48", "memory": "180Gi"}
    spec["internalIp"] = _next_ip({n["internalIp"] for n in nodes}, "127.0.11.0/24")
    spec["externalIp"] = _next_ip({n["externalIp"] for n in nodes}, "127.0.21.0/24")
    if gpus:
        labels.update(GKE_GPU_LABELS)
        spec["taints"] = [GPU_TAINT]
        spec["gpus"] = {"count": gpus}
    _run(lambda: admin.add_node(spec))
    console.print(f"node {name} added ({gpus} GPUs, external IP {spec['externalIp']})")


@node_app.command("remove")
def node_remove(name: str, state_dir: StateDir = None) -> None:
    """A node leaves the cluster (deleted, or its VM gone)."""
    admin = _admin(state_dir)
    _run(lambda: admin.remove_node(name))
    console.print(f"node {name} removed")


@node_app.command("preempt")
def node_preempt(
    name: str,
    notice: Annotated[
        int,
        typer.Option(
            "--notice", min=0, max=3600, help="seconds between the announcement and the VM's end"
        ),
    ] = 30,
    state_dir: StateDir = None,
) -> None:
    """A spot VM's preemption: announced now (the node tainted
    cloud.google.com/impending-node-termination, as GKE does), the machine gone after --notice."""
    admin = _admin(state_dir)
    _run(lambda: admin.preempt_node(name, notice))
    console.print(f"node {name} preemption announced: its machine goes in {notice}s")


@node_app.command("not-ready")
def node_not_ready(name: str, state_dir: StateDir = None) -> None:
    """The node's kubelet reports NotReady."""
    admin = _admin(state_dir)
    _run(lambda: admin.set_node_ready(name, False))
    console.print(f"node {name} is NotReady")


@node_app.command("ready")
def node_ready(name: str, state_dir: StateDir = None) -> None:
    """The node's kubelet reports Ready again."""
    admin = _admin(state_dir)
    _run(lambda: admin.set_node_ready(name, True))
    console.print(f"node {name} is Ready")


@app.command("egress-ip")
def egress_ip(
    ip: Annotated[str | None, typer.Argument(help="the new egress IP; omit to show it")] = None,
    state_dir: StateDir = None,
) -> None:
    """Show or change the controlplane's egress IP (EKS nodes replaced)."""
    admin = _admin(state_dir)
    access = (
        _run(admin.access) if ip is None else _run(lambda: admin.update_access({"egressIp": ip}))
    )
    networks = ", ".join(access["authorizedNetworks"] or ["(check off)"])
    console.print(f"egress IP {access['egressIp']}; authorized networks {networks}")


@app.command("replace-eks-nodes")
def replace_eks_nodes(
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help="the sandbox's AWS (moto) endpoint (default: $AWS_ENDPOINT_URL, else dev up's)",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="the EKS cluster (default: $LEVERS9_EKS_CLUSTER)"),
    ] = None,
    state_dir: StateDir = None,
) -> None:
    """The controlplane's EKS nodes are replaced (new public IPs); its egress IP follows."""
    from botocore.exceptions import BotoCoreError, ClientError

    from sandbox import aws

    admin = _admin(state_dir)
    # The sandbox's state is `<home>/dev/sandbox`; the dev stack beside it records moto.
    moto = DevStack(home=admin.state_dir.parent.parent).records().get("moto")
    running = moto.address if moto is not None and is_running(moto) else None
    url = endpoint or os.environ.get("AWS_ENDPOINT_URL") or running
    if url is None:
        fail(["no sandbox AWS: start it with `levers9 dev up`, or pass --endpoint"])
        raise typer.Exit(1)
    name = cluster or os.environ.get("LEVERS9_EKS_CLUSTER") or aws.CLUSTER
    try:
        before = aws.node_ips(url, name)
        after = aws.replace_eks_nodes(url, name)
    except (aws.AwsSandboxError, BotoCoreError, ClientError) as exc:
        fail([f"replacing the nodes of EKS cluster {name} at {url}: {exc}"])
        raise typer.Exit(1) from None
    old_egress = _run(admin.access)["egressIp"]
    access = _run(lambda: admin.update_access({"egressIp": after[0]}))
    console.print(f"EKS nodes of {name}: {', '.join(before)} -> {', '.join(after)}")
    console.print(f"egress IP {old_egress} -> {access['egressIp']}")
    networks = access["authorizedNetworks"]
    if networks is not None and not any(
        ipaddress.ip_address(after[0]) in ipaddress.ip_network(n) for n in networks
    ):
        console.print(
            "the new egress IP is not on the cluster's authorized networks: the controlplane's"
            " calls now get 403; append it with `levers9 egress rotate --cluster <cluster>`"
            " (the rotate_ips signal), or rerun the attach script"
        )
