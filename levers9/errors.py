"""Errors every levers9 process may meet, kept apart so the CLI can name them without importing
the clients that raise them."""

from __future__ import annotations

CONTROLPLANE_UNREACHABLE_EXIT = 69
"""The exit status of a command the controlplane did not answer: sysexits' EX_UNAVAILABLE
("a service is unavailable"), apart from 1 (failed), 2 (usage) and 4 (past --wait)."""


class Unreachable(RuntimeError):
    """A server levers9 needs did not answer; the message names the server, where it was
    dialed, and the setting that points there."""

    exit_code = 1


class ControlplaneUnreachable(Unreachable):
    """The controlplane (worker_main: its gateway and its Temporal worker) did not answer,
    though Temporal did: whatever the command printed beside it is the last state Temporal
    recorded, not the controlplane's answer."""

    exit_code = CONTROLPLANE_UNREACHABLE_EXIT
