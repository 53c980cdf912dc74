"""Which worker runs a task, on which of its cards (pure; PoolWorkflow's state).

A task needs `gpus` cards of ONE worker at once (a multi-card job needs one worker with that
many). Waiting tasks are served in arrival order, each on the worker that fits it most tightly.
So that a stream of small tasks cannot starve a big one, a task that has waited longer than the
reservation threshold reserves the worker that can hold it soonest; smaller tasks then stop
taking cards there, and the cards it frees go to the big task. A worker that holds only part of
its node's cards (a neighbour had the rest when it started) can be reserved too: drained, it winds
down, and the machine's next worker takes every card the node has free.
"""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class Slot(BaseModel):
    """An available worker: its cards, and which task holds which."""

    worker_id: str
    node_name: str
    address: str
    devices: tuple[int, ...]
    task_queue: str | None = None
    tls: bool = False
    node_gpus: int = 0
    """Cards of its node: a worker that holds fewer (a neighbour had the rest) can give way to
    one that takes them all, once it drains."""
    busy: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    silent: bool = False
    """No heartbeat for the liveness window: nothing is placed on it until it is heard again
    (its ledger kept: its tasks may still run), or until its record ends and it leaves."""

    def could_hold(self, gpus: int) -> bool:
        return max(self.node_gpus, len(self.devices)) >= gpus

    def free(self) -> list[int]:
        held = {card for cards in self.busy.values() for card in cards}
        return [card for card in self.devices if card not in held]


class Waiting(BaseModel):
    task_id: str
    gpus: int
    since: datetime
    ports: tuple[int, ...] = ()
    """Ports it publishes: its containers share the worker's network, so it goes where no
    placed task publishes them."""


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    worker_id: str
    node_name: str
    address: str
    gpu_indices: tuple[int, ...]
    task_queue: str | None = None
    tls: bool = False
    ports: tuple[int, ...] = ()


class QueueSpot(BaseModel):
    """Where a waiting task stands (`levers9 task get` of a queued task)."""

    position: int
    """1: the next to be placed."""
    waiting: int
    gpus: int
    most_free: int
    """The most cards free on any one available worker now."""
    workers: int


class PoolState(BaseModel):
    """Everything PoolWorkflow knows; carried across continue-as-new as it is."""

    slots: dict[str, Slot] = Field(default_factory=dict)
    waiting: list[Waiting] = Field(default_factory=list)
    placed: dict[str, Placement] = Field(default_factory=dict)
    reservations: dict[str, str] = Field(default_factory=dict)
    """worker id -> the task id that reserved it."""
    notify: list[str] = Field(default_factory=list)
    """Tasks that asked by signal (`request`) and are told their placement by signal."""
    _waiting_ids: set[str] | None = PrivateAttr(default=None)

    def _ids(self) -> set[str]:
        if self._waiting_ids is None:
            self._waiting_ids = {w.task_id for w in self.waiting}
        return self._waiting_ids

    def add_worker(self, slot: Slot) -> None:
        current = self.slots.get(slot.worker_id)
        busy = current.busy if current else {}
        self.slots[slot.worker_id] = slot.model_copy(update={"busy": busy})

    def silence(self, worker_id: str) -> None:
        """The worker fell silent: out of placement, and a task that reserved it reserves
        another; `add_worker` (it was heard again) puts it back with its ledger."""
        slot = self.slots.get(worker_id)
        if slot is not None:
            slot.silent = True
            self.reservations.pop(worker_id, None)

    def placeable(self) -> list[Slot]:
        return [slot for slot in self.slots.values() if not slot.silent]

    def remove_worker(self, worker_id: str) -> list[str]:
        """The worker is gone; returns the tasks that were placed on it."""
        self.slots.pop(worker_id, None)
        self.reservations.pop(worker_id, None)
        lost = [t for t, p in self.placed.items() if p.worker_id == worker_id]
        for task_id in lost:
            del self.placed[task_id]
        return lost

    def request(
        self,
        task_id: str,
        gpus: int,
        now: datetime,
        *,
        notify: bool = False,
        ports: tuple[int, ...] = (),
    ) -> None:
        """Queues the task (once: a repeated request changes nothing), in the order of `now`:
        its creation when the request carries it, so the queue keeps the tasks' own order."""
        if task_id in self.placed or task_id in self._ids():
            return
        waiting = Waiting(task_id=task_id, gpus=gpus, since=now, ports=ports)
        if not self.waiting or self.waiting[-1].since <= now:
            self.waiting.append(waiting)
        else:
            # Requests travel apart, so one may come after a later task's: O(log n) to find
            # its place (a standing queue of 10,000 takes 10,000 of them in a few tasks).
            at = bisect.bisect_right(self.waiting, now, key=lambda w: w.since)
            self.waiting.insert(at, waiting)
        self._ids().add(task_id)
        if notify:
            self.notify.append(task_id)

    def most_free(self) -> int:
        """The most cards free on any one worker that can be placed on now."""
        return max((len(slot.free()) for slot in self.placeable()), default=0)

    def spot(self, task_id: str) -> QueueSpot | None:
        """Where the task stands in the queue; None when it does not wait."""
        if task_id not in self._ids():
            return None
        for index, waiting in enumerate(self.waiting):
            if waiting.task_id == task_id:
                return QueueSpot(
                    position=index + 1,
                    waiting=len(self.waiting),
                    gpus=waiting.gpus,
                    most_free=self.most_free(),
                    workers=len(self.slots),
                )
        return None

    def release(self, task_id: str) -> None:
        placement = self.placed.pop(task_id, None)
        if placement and placement.worker_id in self.slots:
            self.slots[placement.worker_id].busy.pop(task_id, None)
        if task_id in self._ids():  # withdrawn while it waits
            self.waiting = [w for w in self.waiting if w.task_id != task_id]
            self._ids().discard(task_id)
            if task_id in self.notify:
                self.notify.remove(task_id)
        for worker_id, holder in list(self.reservations.items()):
            if holder == task_id:
                del self.reservations[worker_id]

    def assign(self, now: datetime, reserve_after: timedelta) -> list[Placement]:
        """Places every waiting task that fits, in arrival order; returns the new placements."""
        made = []
        still_waiting = []
        most_free = self.most_free()
        placeable = len(self.placeable())
        for waiting in self.waiting:
            if waiting.gpus and most_free == 0 and len(self.reservations) >= placeable:
                # No card free and every worker reserved: it neither fits nor reserves (a
                # standing queue of thousands costs a look per task, not a scan of the workers).
                still_waiting.append(waiting)
                continue
            slot = self._fit(waiting) if waiting.gpus <= most_free else None
            if slot is None:
                if now - waiting.since >= reserve_after:
                    self._reserve(waiting)
                still_waiting.append(waiting)
                continue
            cards = tuple(slot.free()[: waiting.gpus])
            slot.busy[waiting.task_id] = cards
            placement = Placement(
                task_id=waiting.task_id,
                worker_id=slot.worker_id,
                node_name=slot.node_name,
                address=slot.address,
                task_queue=slot.task_queue,
                tls=slot.tls,
                gpu_indices=cards,
                ports=waiting.ports,
            )
            self.placed[waiting.task_id] = placement
            for worker_id, holder in list(self.reservations.items()):
                if holder == waiting.task_id:
                    del self.reservations[worker_id]
            made.append(placement)
            self._ids().discard(waiting.task_id)
            most_free = self.most_free()
        self.waiting = still_waiting
        return made

    def _fit(self, waiting: Waiting) -> Slot | None:
        fits = [
            slot
            for slot in self.placeable()
            if len(slot.free()) >= waiting.gpus
            and self.reservations.get(slot.worker_id, waiting.task_id) == waiting.task_id
            and not (waiting.ports and self._published(slot) & set(waiting.ports))
        ]
        return min(fits, key=lambda s: (len(s.free()), s.worker_id), default=None)

    def _published(self, slot: Slot) -> set[int]:
        """Ports the tasks placed on the worker publish."""
        return {
            port
            for task_id in slot.busy
            if (placed := self.placed.get(task_id)) is not None
            for port in placed.ports
        }

    def _reserve(self, waiting: Waiting) -> None:
        if waiting.task_id in self.reservations.values():
            return
        able = [
            slot
            for slot in self.placeable()
            if slot.could_hold(waiting.gpus) and slot.worker_id not in self.reservations
        ]
        if able:
            # The one that can hold it soonest: most cards of its own, then most free.
            best = max(able, key=lambda s: (len(s.devices), len(s.free()), s.worker_id))
            self.reservations[best.worker_id] = waiting.task_id
