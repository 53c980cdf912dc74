"""`levers9 dev`: run the embedded default on this machine (all on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, get_args, get_type_hints

import typer
from rich.status import Status

from levers9.cli import config_cmd, demo_timeline, machine, pool, worker
from levers9.cli.output import Output, console, fail, render
from levers9.devstack.options import DevOptions
from levers9.devstack.processes import DevError, is_running, temporal_binary
from levers9.devstack.stack import DevStack
from levers9.records.listing import wait_for_workers
from levers9.temporal import wait_for_passes
from sandbox.persist import snapshot_path

app = typer.Typer(help="The embedded default: Temporal dev server, sandbox, controlplane.")


def _typer_option(name: str, hint: Any) -> Any:
    """`Annotated[int, "help"]` as `Annotated[int, typer.Option("--name", help="help")]`."""
    kind, text = get_args(hint)
    return Annotated[kind, typer.Option("--" + name.replace("_", "-"), help=text)]


def with_dev_options(command: Callable[[DevStack], None]) -> Callable[..., None]:
    """`command` as a typer command whose options are DevOptions' fields (their help and
    defaults), called with the stack they describe."""

    def run(**options: Any) -> None:
        command(DevStack(options=DevOptions(**options)))

    hints = get_type_hints(DevOptions, include_extras=True)
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                option.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=option.default,
                annotation=_typer_option(option.name, hints[option.name]),
            )
            for option in dataclasses.fields(DevOptions)
        ]
    )
    run.__name__, run.__doc__ = command.__name__, command.__doc__
    return run


DEMO_PASSES = 2
DEMO_TIMEOUT_S = 90.0


def _up(stack: DevStack) -> None:
    with Status("starting", console=console) as status:

        def progress(message: str) -> None:
            status.update(message)
            console.print(f"  {message}", highlight=False)

        try:
            stack.up(progress)
        except DevError as exc:
            fail([str(exc)])
            raise typer.Exit(1) from None


@app.command()
@with_dev_options
def up(stack: DevStack) -> None:
    """Start the stack (what already runs is left alone) and write .levers9/dev/env; the
    sandbox's cluster is the one it saved at `dev down` (--fresh: the scenario's)."""
    _up(stack)
    _print_status(stack, Output.table)
    console.print(f"\nsource [bold]{stack.env_file}[/bold] to point temporal/kubectl at it")
    console.print(f"kubectl: KUBECONFIG={stack.env()['KUBECONFIG']} kubectl get nodes")
    console.print(
        f"dashboard: {stack.env()['LEVERS9_ENDPOINTS_URL']}/ui/ (token: {stack.api_token_file})"
    )


@app.command()
def down() -> None:
    """Stop exactly what `levers9 dev up` started."""
    stack = DevStack()
    stopped = stack.down(lambda message: console.print(f"  {message}", highlight=False))
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    saved = snapshot_path(stack.sandbox_dir)
    if saved.exists():
        console.print(
            f"the sandbox's cluster is saved in {saved}: `levers9 dev up` brings it back,"
            " `levers9 dev up --fresh` starts from the scenario",
            highlight=False,
        )


def _print_status(stack: DevStack, output: Output) -> None:
    """The stack's processes, then any strays (in JSON, rows of component `stray`)."""
    rows: list[dict[str, object]] = [
        {
            "component": record.name,
            "pid": record.pid,
            "state": "running" if is_running(record) else "stopped",
            "address": record.address,
            "log": record.log,
        }
        for record in stack.records().values()
    ]
    strays = [{"component": "stray", **s.row()} for s in stack.find_strays()]
    if output is Output.json:
        render([*rows, *strays], [], output)
        return
    if rows:
        render(
            rows,
            [
                ("component", "COMPONENT"),
                ("pid", "PID"),
                ("state", "STATE"),
                ("address", "ADDRESS"),
                ("log", "LOG"),
            ],
            output,
            title="levers9 dev",
        )
    if strays:
        render(
            strays,
            [("kind", "KIND"), ("name", "NAME"), ("pid", "PID"), ("where", "WHERE")],
            output,
            title="strays: left by worker agents, removed by levers9 dev down",
        )


@app.command()
def status(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """Say what runs where."""
    stack = DevStack()
    if not stack.records():
        found = stack.find_strays()
        if output is Output.table or not found:
            console.print("nothing is running; start it with `levers9 dev up`")
        if found:
            _print_status(stack, output)
        raise typer.Exit(0)
    _print_status(stack, output)


@app.command()
@with_dev_options
def demo(stack: DevStack) -> None:
    """`make demo`: the spec's page on the sandbox, from the stack coming up to COMPLETE."""
    start = datetime.now(UTC)
    _up(stack)
    os.environ.update(stack.env())
    console.rule("the cloud side: deploy/gke/attach-gke-pool.sh (until it runs, reconcile is 403)")
    attach = [str(ATTACH_SCRIPT), *ATTACH_ARGS, *(["--tunnel"] if stack.options.tunnel else [])]
    console.print("$ " + " ".join(attach), highlight=False)
    if subprocess.run(attach, check=False, env={**os.environ, "LEVERS9": _levers9()}).returncode:
        fail(["attach failed (above); fix it and rerun make demo: every step is idempotent"])
        raise typer.Exit(1)
    console.rule("the pools in the dev values")
    config_cmd.show_pools(stack.values_files, Output.table)
    console.rule(f"waiting for {DEMO_PASSES} reconcile passes per pool")
    settings = stack.settings()
    with Status("waiting for the schedules to fire", console=console) as spinner:

        def progress(done: int) -> None:
            spinner.update(f"reconcile passes so far: {done}/{DEMO_PASSES}")

        try:
            asyncio.run(wait_for_passes(settings, DEMO_PASSES, DEMO_TIMEOUT_S, progress))
        except TimeoutError:
            logs_dir = stack.dir / "logs"
            fail([f"no {DEMO_PASSES} reconcile passes in {DEMO_TIMEOUT_S:.0f}s; see {logs_dir}"])
            raise typer.Exit(1) from None
    console.rule("waiting for a worker on every machine (pending -> available)")
    with Status("waiting for workers", console=console) as spinner:

        def workers_progress(available: int, machines: int) -> None:
            spinner.update(f"workers available: {available}/{machines or '?'}")

        try:
            asyncio.run(wait_for_workers(settings, DEMO_TIMEOUT_S, workers_progress))
        except TimeoutError:
            fail([f"workers not available in {DEMO_TIMEOUT_S:.0f}s; see levers9 worker list"])
            raise typer.Exit(1) from None
    for args in (["get", "nodes", "-o", "wide"], ["get", "pods", "-A", "-o", "wide"]):
        console.rule(f"kubectl {' '.join(args)}")
        subprocess.run(["kubectl", *args], check=False)
    console.rule("temporal schedule list")
    subprocess.run([str(temporal_binary()), "schedule", "list"], check=False)
    console.rule("levers9 pool list")
    pool.show_pools(settings, Output.table)
    console.rule("levers9 machine list")
    machine.list_(pool=None, output=Output.table)
    console.rule("levers9 worker list")
    worker.list_(pool=None, all_=False, output=Output.table)
    console.rule("the first jobs: the GPU check (cold), then `true` (warm)")
    cold, warm = asyncio.run(demo_timeline.first_jobs(settings))
    demo_timeline.show(stack, start, cold, warm)
    env = stack.env()
    levers9, temporal = _command("levers9"), _command("temporal")
    console.print(
        f"\nThe stack keeps running.\n"
        f"  Temporal UI:   {env['LEVERS9_TEMPORAL_UI']}\n"
        f"  status:        {levers9} dev status\n"
        f"  pools:         {levers9} pool list, machine list, worker list\n"
        f"  the cluster:   KUBECONFIG={env['KUBECONFIG']} kubectl get nodes\n"
        f"  change it:     {levers9} sandbox node add|remove|not-ready|ready|preempt,"
        " sandbox egress-ip\n"
        f"  use it:        . {stack.env_file} && {temporal} workflow list\n"
        f"  stop it:       {levers9} dev down",
        highlight=False,
    )


ATTACH_SCRIPT = Path(__file__).parents[2] / "deploy" / "gke" / "attach-gke-pool.sh"
ATTACH_ARGS = (
    *("--project", "demo", "--zone", "us-central1-a", "--cluster", "demo"),
    *("--node-pool", "gpu-4x", "--gpu", "RTXPro6000"),
)


def _levers9() -> str:
    return str(Path(sys.executable).parent / "levers9")


def _command(name: str) -> str:
    """`name` when the shell finds this environment's copy, else its path."""
    ours = Path(sys.executable).parent / name
    return name if shutil.which(name) == str(ours) else str(ours)
