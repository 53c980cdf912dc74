"""What every in-process controller is made of: watches that turn events into keys, a
deduplicating work queue, one worker that reconciles a key at a time, and a periodic resync.

This is client-go's informer + workqueue shape, reduced to the API the registry offers. It is
level-triggered: an event only says "look at this key again"; `reconcile` reads the current
state and acts on it, so a dropped watch (re-opened with a fresh snapshot) or a missed event
is repaired by the next event or by the resync.
"""

from __future__ import annotations

import abc
import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from levers9.logs import get_logger
from sandbox import errors
from sandbox.resources import Resource
from sandbox.store import StoredEvent

if TYPE_CHECKING:
    from sandbox.registry import Registry

log = get_logger("sandbox.cluster")

K = TypeVar("K", bound=Hashable)
Handler = Callable[[StoredEvent], None]

REWATCH_PAUSE_S = 0.2  # between a watch that ended and its replacement: no hot loop
ERROR_BACKOFF_S = (0.05, 5.0)  # first and longest requeue delay after a failed reconcile


class WorkQueue(Generic[K]):
    """A FIFO of keys where a key is at most once in the queue, and a key added while it is
    being processed is processed again afterwards (never twice at the same time)."""

    def __init__(self) -> None:
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` once `delay` seconds have passed (the earliest of several requests)."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def watch_forever(
    registry: Registry,
    resource: Resource,
    handler: Handler,
    *,
    namespace: str | None = None,
    field_selector: str | None = None,
) -> None:
    """Feeds every event of `resource` to `handler`, re-opening the watch when it ends.

    Each watch starts with the current objects as ADDED events (a relist), so a handler sees
    every live object again after a drop; handlers only enqueue keys, which makes that
    harmless. Runs until cancelled.
    """
    while True:
        try:
            watch = registry.watch(resource, namespace, field_selector=field_selector)
        except errors.ApiError as error:
            log.warning("watch failed", resource=resource.plural, code=error.code)
        else:
            async with watch:
                async for event in watch:
                    try:
                        handler(event)
                    except Exception:
                        log.exception("watch handler failed", resource=resource.plural)
        await asyncio.sleep(REWATCH_PAUSE_S)


@dataclass(frozen=True)
class Watched:
    """One watch a controller keeps open."""

    resource: Resource
    handler: Handler
    field_selector: str | None = None


class Controller(abc.ABC, Generic[K]):
    """Watches → queue → `reconcile`, plus a resync every `resync_s` (see module doc)."""

    name: str = "controller"

    def __init__(self, registry: Registry, resync_s: float) -> None:
        self.registry = registry
        self.queue: WorkQueue[K] = WorkQueue()
        self._resync_s = resync_s
        self._failures: dict[K, int] = {}

    @abc.abstractmethod
    def watched(self) -> list[Watched]:
        """The watches that feed the queue."""

    @abc.abstractmethod
    def resync_keys(self) -> Iterable[K]:
        """Every key worth a periodic look (read from the registry)."""

    @abc.abstractmethod
    def reconcile(self, key: K) -> float | None:
        """Brings `key` toward its desired state; returns seconds after which to look again."""

    async def run(self) -> None:
        """Runs until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                for watch in self.watched():
                    group.create_task(
                        watch_forever(
                            self.registry,
                            watch.resource,
                            watch.handler,
                            field_selector=watch.field_selector,
                        )
                    )
                group.create_task(self._resync())
                group.create_task(self._work())
        finally:
            self.queue.close()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self._resync_s)
            try:
                for key in self.resync_keys():
                    self.queue.add(key)
            except errors.ApiError as error:
                log.warning("resync failed", controller=self.name, code=error.code)

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                again = self.reconcile(key)
            except errors.ApiError as error:
                again = self._backoff(key)
                if error.code != 409:  # a conflict only means someone wrote first: retry
                    log.warning(
                        "reconcile failed",
                        controller=self.name,
                        key=str(key),
                        code=error.code,
                        error=error.message,
                    )
            except Exception:
                again = self._backoff(key)
                log.exception("reconcile failed", controller=self.name, key=str(key))
            else:
                self._failures.pop(key, None)
            finally:
                self.queue.done(key)
            if again is not None:
                self.queue.add_after(key, again)
            # Reconciles are synchronous: yield so watches and kubelets keep running.
            await asyncio.sleep(0)

    def _backoff(self, key: K) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        first, longest = ERROR_BACKOFF_S
        return float(min(first * 2**failures, longest))
