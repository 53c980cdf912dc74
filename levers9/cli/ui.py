"""`levers9 ui`: the dashboard (`/ui/` of the controlplane's endpoints URL) in a browser.

It prints the URL, then opens it with the system's browser (`--no-open`: only prints it). The
page asks for a token: the CLI's own (a workspace's, or the operator's that `levers9 dev up`
writes); the CLI never hands its token to the browser.
"""

from __future__ import annotations

import webbrowser
from typing import Annotated

import typer

from levers9.cli.output import console
from levers9.cli.runtime import settings_from_env


def dashboard_url() -> str:
    return settings_from_env().endpoints_base_url() + "/ui/"


def ui(
    open_: Annotated[
        bool, typer.Option("--open/--no-open", help="open it in the browser (else: print it)")
    ] = True,
) -> None:
    """Open the web dashboard (pools, machines, tasks, endpoints, workspaces); prints its URL."""
    url = dashboard_url()
    console.print(url, highlight=False, soft_wrap=True)
    if open_ and not webbrowser.open(url):
        console.print("no browser here: open the URL above in yours", highlight=False)
