"""Leaving a process that loaded the gRPC core (every one that imports temporalio or grpc)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flushes and exits without interpreter finalization.

    The gRPC core's threads can abort a finalizing interpreter ("PyGILState_Release: thread
    state must be current when releasing"), which turns a clean exit into status 134. Every
    resource is closed before this is called; only finalization is skipped.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
