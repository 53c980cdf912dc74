"""`levers9`: the controlplane's Kubernetes provider pool, from the command line."""

from __future__ import annotations

import typer

from levers9 import logs
from levers9.cli import config_cmd, dev, egress, gke, image, machine, pool, sandbox, task, worker
from levers9.cli.runtime import honour_dev_env
from levers9.process import exit_now

app = typer.Typer(
    help="levers9: GPU nodes of a Kubernetes cluster you already run, as a worker pool.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(config_cmd.app, name="config")
app.add_typer(dev.app, name="dev")
app.add_typer(pool.app, name="pool")
app.add_typer(machine.app, name="machine")
app.add_typer(worker.app, name="worker")
app.add_typer(task.app, name="task")
app.command("run", context_settings={"allow_extra_args": False, "ignore_unknown_options": True})(
    task.run
)
app.add_typer(gke.app, name="gke")
app.add_typer(egress.app, name="egress")
app.add_typer(image.app, name="image")
app.add_typer(sandbox.app, name="sandbox")


@app.callback()
def _main(
    log_level: str = typer.Option("WARNING", "--log-level", help="log level of this command"),
) -> None:
    honour_dev_env()
    logs.setup(log_level)


def main() -> None:
    """The `levers9` command; it leaves through `exit_now` (see there why)."""
    try:
        app()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    exit_now(code)
