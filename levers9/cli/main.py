"""`levers9`: the controlplane's Kubernetes provider pool, from the command line.

The command starts at once: each command group's module (and what it pulls in: the Temporal
client, the cloud SDKs, the emulator behind `levers9 dev` and `levers9 sandbox`) is imported only
when that group runs. `levers9 --help` lists the groups from the table below without importing
any of them; `tests/integration/test_cli_startup.py` holds it to that.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from levers9.errors import Unreachable
from levers9.process import exit_now


@dataclass(frozen=True)
class _Entry:
    module: str
    help: str
    attr: str = "app"
    """`app`: the module's Typer group; any other name: a single command function."""
    dev_only: bool = False
    """Needs the emulator (`sandbox`), which only the dev install carries."""


COMMANDS: dict[str, _Entry] = {
    "config": _Entry("levers9.cli.config_cmd", "Values files: validate them before you deploy."),
    "dev": _Entry(
        "levers9.cli.dev",
        "The embedded default: Temporal dev server, sandbox, controlplane.",
        dev_only=True,
    ),
    "pool": _Entry("levers9.cli.pool", "Pools as the controlplane runs them."),
    "machine": _Entry(
        "levers9.cli.machine", "Machines: the pool's nodes, sized by what their neighbours leave."
    ),
    "worker": _Entry(
        "levers9.cli.worker", "Workers: the privileged Jobs that took every free card of a machine."
    ),
    "task": _Entry("levers9.cli.task", "Tasks: what users run on the workers, and their records."),
    "run": _Entry(
        "levers9.cli.task",
        "Run CMD on a worker of the pool: prints the task id, its output, then its result.",
        attr="run",
    ),
    "exec": _Entry(
        "levers9.cli.task_exec",
        "Run CMD in a running task's container: its output, then its exit code as ours.",
        attr="exec_",
    ),
    "port-forward": _Entry(
        "levers9.cli.port_forward",
        "Forward local ports to a task's published container ports, as kubectl port-forward.",
        attr="port_forward",
    ),
    "endpoint": _Entry(
        "levers9.cli.endpoint",
        "Endpoints: HTTP services whose replicas are tasks, scaled to zero and back.",
    ),
    "cluster": _Entry(
        "levers9.cli.cluster",
        "Clusters joined through an agent that dials out: nothing to allow-list, no key.",
    ),
    "workspace": _Entry(
        "levers9.cli.workspace",
        "Workspaces: a team's share of the controlplane, its quota and its tokens.",
    ),
    "volume": _Entry(
        "levers9.cli.volume",
        "Volumes: a workspace's buckets, mounted into its tasks with its own credentials.",
    ),
    "disk": _Entry(
        "levers9.cli.disk",
        "Disks: a workspace's durable filesystems on one machine, which pin its tasks there.",
    ),
    "box": _Entry(
        "levers9.cli.box",
        "Boxes: a workspace's long-lived machines with a shell, ports and a home that stays.",
    ),
    "login": _Entry(
        "levers9.cli.profile",
        "Check a token with the controlplane, then keep it as a profile, made current.",
        attr="login",
    ),
    "whoami": _Entry(
        "levers9.cli.profile",
        "Who this command runs as: the workspace or operator, the controlplane, the token's label.",
        attr="whoami",
    ),
    "profile": _Entry(
        "levers9.cli.profile",
        "Profiles: which controlplane and token the CLI uses (levers9 login writes them).",
    ),
    "ui": _Entry(
        "levers9.cli.ui",
        "Open the web dashboard (pools, machines, tasks, endpoints, workspaces); prints its URL.",
        attr="ui",
    ),
    "gke": _Entry("levers9.cli.gke", "The cloud side of GKE pools."),
    "egress": _Entry("levers9.cli.egress", "The controlplane's egress IPs on GKE allowlists."),
    "image": _Entry("levers9.cli.image", "The worker image in the pools' registries."),
    "sandbox": _Entry(
        "levers9.cli.sandbox",
        "The sandbox: a local GKE-like cluster kubectl and the client drive.",
        dev_only=True,
    ),
}

DEV_EXTRA_HINT = (
    "levers9 {name} needs the emulator, which only the dev install carries:"
    " pip install 'levers9-pools[dev]' in a checkout (make does it)"
)


def _load(name: str, entry: _Entry) -> Any:
    """The click command of `name` (typed Any: Typer's click is its own vendored copy)."""
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        if entry.dev_only and exc.name is not None and exc.name.split(".")[0] == "sandbox":
            typer.echo(f"error: {DEV_EXTRA_HINT.format(name=name)}", err=True)
            raise typer.Exit(2) from None
        raise
    target = getattr(module, entry.attr)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:
        # A single command: registered on a Typer of its own so Typer parses its annotations.
        single = typer.Typer()
        single.command(name, context_settings={"allow_extra_args": False})(target)
        single.callback()(lambda: None)
        command = typer.main.get_command(single).commands[name]  # type: ignore[attr-defined]
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """The top-level group: a command's module is imported when the command is resolved; help
    shows each command's line from `COMMANDS` without importing anything."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict[str, Any] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self._loaded:
            return self._loaded[cmd_name]
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        # A stand-in for the listing; resolve_command swaps in the real command.
        return TyperCommand(cmd_name, help=entry.help, short_help=entry.help)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else None
        if name in COMMANDS and name not in self._loaded:
            self._loaded[name] = _load(name, COMMANDS[name])
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=LazyGroup,
    help="levers9: GPU nodes of a Kubernetes cluster you already run, as a worker pool.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@app.callback()
def _main(
    log_level: str = typer.Option(
        "WARNING", "--log-level", help=f"log level of this command: {', '.join(LOG_LEVELS)}"
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        envvar="LEVERS9_PROFILE",
        help="the profile (levers9 login) this command runs as, instead of the current one",
        show_envvar=True,
    ),
) -> None:
    from levers9 import logs
    from levers9.cli.runtime import honour_dev_env

    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(
            f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}", param_hint="--log-level"
        )
    if profile:  # the environment carries it to the subcommand (and a levers9 it starts)
        os.environ["LEVERS9_PROFILE"] = profile
    honour_dev_env()
    logs.setup(log_level)


def not_utf8(argv: list[str]) -> str | None:
    """Why an argument cannot be taken (bytes that are not UTF-8, which Python hands over as
    lone surrogates): a command, a name, a value all travel as UTF-8 text."""
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(arg)
            return (
                f"argument {number} ({raw!r}) is not UTF-8 text: levers9 takes UTF-8 arguments"
                " (a task's command and environment are text); pass binary data in a file"
            )
    return None


def main() -> None:
    """The `levers9` command; it leaves through `exit_now` (see there why)."""
    problem = not_utf8(sys.argv[1:])
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        exit_now(2)
    try:
        app()
        code = 0
    except Unreachable as exc:
        typer.echo(f"error: {exc}", err=True)
        code = exc.exit_code
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    exit_now(code)
