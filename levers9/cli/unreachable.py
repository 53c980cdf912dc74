"""When the controlplane does not answer: the one line every command says, and its exit status.

The controlplane is worker_main: its gateway, and its Temporal worker, the only one that
answers the queries of our workflows. Temporal (a server of its own) still answers what it
holds without a worker: a workflow's memo, search attributes and status, visibility lists,
schedules, signals. With the controlplane down a command says `controlplane unreachable at
<gateway address>` and what to check, shows what Temporal last recorded where it can, and exits
69 (CONTROLPLANE_UNREACHABLE_EXIT).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

from levers9.cli.output import fail
from levers9.errors import CONTROLPLANE_UNREACHABLE_EXIT, ControlplaneUnreachable

if TYPE_CHECKING:
    from levers9.config import ControlplaneSettings


def unreachable(settings: ControlplaneSettings, *problems: str) -> ControlplaneUnreachable:
    """The error a command ends with: where the controlplane should be, what did not answer,
    and what to check."""
    return ControlplaneUnreachable(
        f"controlplane unreachable at {settings.cli_gateway_address()}: {'; '.join(problems)}."
        " Check that it runs (`levers9 dev status` for the dev stack; its pods and their logs"
        " on a cluster) and that LEVERS9_GATEWAY_ADDRESS (gatewayAddress) names its gateway"
    )


def no_temporal_worker(settings: ControlplaneSettings, why: str) -> str:
    return f"its Temporal worker answered no query on task queue {settings.task_queue} ({why})"


def down(problem: ControlplaneUnreachable) -> NoReturn:
    """Says the problem (stderr) and leaves with CONTROLPLANE_UNREACHABLE_EXIT: for a command
    that printed what Temporal holds first."""
    fail([str(problem)])
    raise typer.Exit(CONTROLPLANE_UNREACHABLE_EXIT)
