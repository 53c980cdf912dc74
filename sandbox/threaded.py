"""The emulator on a background thread, for synchronous callers (tests, benchmarks, scripts).

The official Kubernetes client and kubectl block; run in the same thread as the emulator's
event loop they would wait on themselves. `SandboxThread` gives the emulator its own loop and
thread, and `call` runs a function there, which is how a synchronous caller reaches the
registry and the store safely (they belong to the loop's thread).

    with SandboxThread() as sandbox_thread:
        sandbox = sandbox_thread.sandbox
        sandbox_thread.call(sandbox.registry.create, NAMESPACES, {"metadata": {"name": "x"}})
        ...  # kubernetes.client against sandbox.url
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from sandbox.registry import Registry
from sandbox.server import Sandbox, SandboxOptions, start_sandbox

T = TypeVar("T")


class LoopThread:
    """A private event loop running in a daemon thread: `run` runs a coroutine there and
    waits; `call` runs a plain function there. For synchronous callers of asyncio servers."""

    def __init__(self, name: str = "levers9-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> None:
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = 60) -> T:
        """Runs a coroutine on the loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs `fn(*args, **kwargs)` on the loop's thread and returns its result."""
        future: Future[T] = Future()

        def invoke() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # handed to the caller's thread
                future.set_exception(error)

        self._loop.call_soon_threadsafe(invoke)
        return future.result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()


class SandboxThread(LoopThread):
    """Runs `start_sandbox(options)` on a LoopThread; `sandbox` once started. A `registry`
    given is served instead of a fresh one (a store on a clock a test moves, say)."""

    def __init__(
        self, options: SandboxOptions | None = None, *, registry: Registry | None = None
    ) -> None:
        super().__init__("levers9-sandbox")
        self._options = options
        self._registry = registry
        self._sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the sandbox is not running; call start() first")
        return self._sandbox

    def start(self) -> None:
        super().start()
        self._sandbox = self.run(start_sandbox(self._options, registry=self._registry))

    def compact(self) -> int:
        """`Sandbox.compact` on the emulator's thread: watches from older versions and
        continue tokens get 410 from now on."""
        return self.call(self.sandbox.compact)

    def drop_watches(self, *, graceful: bool = False) -> int:
        """`Sandbox.drop_watches` on the emulator's thread."""
        return self.call(self.sandbox.drop_watches, graceful=graceful)

    def expire_tokens(self) -> int:
        """`Sandbox.expire_tokens` on the emulator's thread."""
        return self.call(self.sandbox.expire_tokens)

    def stop(self) -> None:
        if self._sandbox is not None:
            self.run(self._sandbox.close())
            self._sandbox = None
        self.close()

    def __enter__(self) -> SandboxThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
