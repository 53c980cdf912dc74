"""A server run as a child process of this one, for tests and scripts: started, waited for
until it answers, stopped (SIGTERM, then SIGKILL), its output appended to a log whose tail
explains a start that failed. The dev stack records its processes itself (`devstack`)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ChildProcess:
    def __init__(
        self,
        what: str,
        log: Path,
        error: type[Exception] = RuntimeError,
        poll_s: float = 0.05,
    ) -> None:
        self.what = what
        self.log = log
        self._error = error
        self._poll_s = poll_s
        self._process: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: Sequence[str], ready: Callable[[], bool]) -> None:
        """Starts `argv` and returns once `ready()`; raises the error type with the log's
        tail when it exits or is not ready in time."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise self._error(f"{self.what} did not start:\n{tail}")
            time.sleep(self._poll_s)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ChildServer:
    """Base of a context-managed child server: subclasses define `start`."""

    child: ChildProcess

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        self.child.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
