"""Errors every levers9 process may meet, kept apart so the CLI can name them without importing
the clients that raise them."""

from __future__ import annotations


class Unreachable(RuntimeError):
    """A server levers9 needs did not answer; the message names the server, where it was
    dialed, and the setting that points there."""
