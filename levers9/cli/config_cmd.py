"""`levers9 config check`: validate values files and show the pools they define."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from levers9.cli.output import Output, fail, render
from levers9.config import ConfigError, KubernetesConfig, load

app = typer.Typer(help="Values files: validate them before you deploy.", no_args_is_help=True)

COLUMNS = [
    ("pool", "POOL"),
    ("gpu_type", "GPU TYPE"),
    ("flavor", "FLAVOR"),
    ("endpoint", "ENDPOINT"),
    ("namespace", "NAMESPACE"),
    ("node_selector", "SELECTOR"),
    ("worker_image", "WORKER IMAGE"),
    ("tunnel", "TUNNEL"),
    ("host_network", "HOST NETWORK"),
    ("credentials", "CREDENTIALS"),
]


def _credentials(kube: KubernetesConfig) -> str:
    if kube.credentials_file is not None:
        return f"file {kube.credentials_file} (**********)"
    if kube.credentials is not None:
        return "inline (**********)"
    return "none"


@app.command()
def check(
    files: Annotated[
        list[Path],
        typer.Option("-f", "--values", help="values file, YAML or JSON (repeatable, merged)"),
    ],
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """Validate values files (merged like `helm -f a -f b`) and print their pools."""
    raise typer.Exit(show_pools(files, output))


def show_pools(files: Sequence[Path], output: Output) -> int:
    """Prints the pools of the values files; returns the exit code (1 when any is wrong)."""
    try:
        values = load(files)
    except ConfigError as exc:
        fail(exc.errors)
        return 1
    rows = [
        {
            "pool": name,
            "gpu_type": pool.gpu_type,
            "flavor": pool.kubernetes.flavor,
            "endpoint": pool.kubernetes.endpoint,
            "namespace": pool.kubernetes.namespace,
            "node_selector": ",".join(f"{k}={v}" for k, v in pool.kubernetes.node_selector.items()),
            "worker_image": pool.kubernetes.worker_image,
            "tunnel": pool.kubernetes.tunnel,
            "host_network": pool.host_network,
            "credentials": _credentials(pool.kubernetes),
        }
        for name, pool in values.pools.items()
    ]
    render(rows, COLUMNS, output, title="pools")
    if values.problems:
        fail([f"pool {p.pool_name}: {p.error}" for p in values.problems])
        return 1
    return 0
