"""Which worker runs a task, on which of its cards (pure; PoolWorkflow's state).

A task needs `gpus` cards of ONE worker at once (a multi-card job needs one worker with that
many). Waiting tasks are served each on the worker that fits it most tightly: across workspaces
by fair share (the workspace that holds the fewest cards for its weight goes first: dominant
share, with cards the one resource, as Kueue and Slurm's fair-share order), within a workspace
in arrival order. A workspace never holds more cards than its quota, except by borrowing: a task
that may borrow (`--borrow`) runs past its quota on cards that no task within its quota waits
for, and is the first taken back (`reclaim`, newest first) when one does.
So that a stream of small tasks cannot starve a big one, a task that has waited longer than the
reservation threshold reserves the worker that can hold it soonest; smaller tasks then stop
taking cards there, and the cards it frees go to the big task. A worker that holds only part of
its node's cards (a neighbour had the rest when it started) can be reserved too: drained, it winds
down, and the machine's next worker takes every card the node has free.
A task that mounts a durable disk is pinned to the disk's node (`Waiting.node`): it goes to a
worker of that node only, and waits (the reason says for which disk and machine) while there is
none or it is busy, or while another placed task holds the disk (one task mounts it at a time).
With the pool's `cache.enabled`, each worker reports the images its node's cache holds (`Slot.
images`: a short key of each normalized reference, the node's most recently used first, at most
`MAX_CACHED_IMAGES`): a task goes to a fitting worker that holds its image (`Waiting.image`)
before any other, then the tightest fit as ever; with it off the agents report nothing and
placement has nothing to prefer.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
from collections import defaultdict, deque
from datetime import datetime, timedelta
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from levers9.core.disks import pinned_reason
from levers9.core.image_reference import ImageReference, ImageReferenceError
from levers9.core.workspaces import DEFAULT_WORKSPACE

MAX_CACHED_IMAGES = 64
"""The most images a worker's report names (its node's most recently used): PoolWorkflow keeps a
key of 16 characters for each, about 1 KiB a worker in its 2 MB state."""


def image_key(reference: str) -> str:
    """The key placement matches a task's image and a node's cache by: 16 hex of the sha256 of
    the reference as Docker reads it (`pytorch/pytorch` is `docker.io/pytorch/pytorch`); ""
    for a text that is not a reference (it matches nothing)."""
    try:
        normalized = str(ImageReference.parse(reference))
    except ImageReferenceError:
        return ""
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]


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
    draining: bool = False
    """Its node is being drained: nothing is placed on it again (kept when it announces itself
    again), and what runs on it is taken back."""
    images: tuple[str, ...] = ()
    """`image_key`s of the images its node's cache holds (reported only with the pool's
    `cache.enabled`; at most MAX_CACHED_IMAGES)."""

    def could_hold(self, gpus: int) -> bool:
        return max(self.node_gpus, len(self.devices)) >= gpus

    def free(self) -> list[int]:
        held = {card for cards in self.busy.values() for card in cards}
        return [card for card in self.devices if card not in held]


QUOTA = "quota"
"""Why a task waits while its workspace holds its quota (QueueSpot.reason)."""


class Waiting(BaseModel):
    task_id: str
    gpus: int
    since: datetime
    workspace: str = DEFAULT_WORKSPACE
    borrow: bool = False
    """It may run past its workspace's quota on cards nobody within quota waits for."""
    ports: tuple[int, ...] = ()
    """Ports it publishes: its containers share the worker's network, so it goes where no
    placed task publishes them."""
    node: str = ""
    """The one node it may run on ("": any): the node of the disk it mounts."""
    pinned_by: str = ""
    """What pins it there (`disk scratch`), for the reason it waits."""
    disk_ids: tuple[str, ...] = ()
    """The disks it mounts (a disk in use is not deleted)."""
    image: str = ""
    """`image_key` of its image: a worker whose node's cache holds it goes first ("": none)."""
    avoid_node: str = ""
    """A node it may not run on ("": none): a box started elsewhere than the node its
    checkpoint was taken on (`box start --elsewhere`)."""

    @model_serializer(mode="wrap")
    def _without_no_image(self, handler: SerializerFunctionWrapHandler) -> Any:
        """`image` and `avoid_node` left out when "": a standing queue of 10,000 is 1.5 MB of
        the pool's 2 MB state, and a pool without `cache.enabled` should pay nothing for it."""
        data = handler(self)
        if isinstance(data, dict):
            for name in ("image", "avoid_node"):
                if not data.get(name):
                    data.pop(name, None)
        return data


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
    workspace: str = DEFAULT_WORKSPACE
    borrowed: bool = False
    """Placed past its workspace's quota: the first taken back when one within quota waits."""
    since: datetime | None = None
    """When it asked (newest borrowed work is reclaimed first)."""
    disk_ids: tuple[str, ...] = ()


class QueueSpot(BaseModel):
    """Where a waiting task stands (`levers9 task get` of a queued task)."""

    position: int
    """1: the next to be placed."""
    waiting: int
    gpus: int
    most_free: int
    """The most cards free on any one available worker now."""
    workers: int
    reason: str = ""
    """`quota`: its workspace holds its quota; `waiting for disk D's machine N`: it runs only
    on its disk's node, which has no worker or no room now; "": it waits for cards."""
    workspace: str = DEFAULT_WORKSPACE


class Share(BaseModel):
    """A workspace's place in the pool: its quota (None: no bound) and weight."""

    quota: int | None = None
    weight: float = 1.0


class PoolState(BaseModel):
    """Everything PoolWorkflow knows; carried across continue-as-new as it is."""

    slots: dict[str, Slot] = Field(default_factory=dict)
    waiting: list[Waiting] = Field(default_factory=list)
    placed: dict[str, Placement] = Field(default_factory=dict)
    reservations: dict[str, str] = Field(default_factory=dict)
    """worker id -> the task id that reserved it."""
    notify: list[str] = Field(default_factory=list)
    """Tasks that asked by signal (`request`) and are told their placement by signal."""
    shares: dict[str, Share] = Field(default_factory=dict)
    """Workspace -> its quota and weight (absent: no quota, weight 1)."""
    reclaiming: dict[str, str] = Field(default_factory=dict)
    """Borrowed task -> the workspace it is taken back for, until it is released."""
    _waiting_ids: set[str] | None = PrivateAttr(default=None)
    _sizes: list[int] | None = PrivateAttr(default=None)
    """How many waiting tasks take no card (they fit a worker with none free), and how many
    take more than one (only those reserve a worker)."""

    def _counts(self) -> list[int]:
        if self._sizes is None:
            self._sizes = [
                sum(1 for w in self.waiting if w.gpus == 0),
                sum(1 for w in self.waiting if _reserves(w)),
            ]
        return self._sizes

    def _zero(self) -> int:
        return self._counts()[0]

    def _count(self, waiting: Waiting, by: int) -> None:
        if self._sizes is not None:
            self._sizes[0] += by if waiting.gpus == 0 else 0
            self._sizes[1] += by if _reserves(waiting) else 0

    def _nothing_to_do(self, most_free: int, placeable: int) -> bool:
        """No card free, no task that takes none, and no reservation to make: every worker
        reserved, or no task that reserves (see `_reserves`)."""
        zero, multi = self._counts()
        return most_free == 0 and zero == 0 and (multi == 0 or len(self.reservations) >= placeable)

    def _ids(self) -> set[str]:
        if self._waiting_ids is None:
            self._waiting_ids = {w.task_id for w in self.waiting}
        return self._waiting_ids

    def add_worker(self, slot: Slot) -> None:
        current = self.slots.get(slot.worker_id)
        busy = current.busy if current else {}
        draining = current.draining if current else slot.draining
        self.slots[slot.worker_id] = slot.model_copy(update={"busy": busy, "draining": draining})

    def silence(self, worker_id: str) -> None:
        """The worker fell silent: out of placement, and a task that reserved it reserves
        another; `add_worker` (it was heard again) puts it back with its ledger."""
        slot = self.slots.get(worker_id)
        if slot is not None:
            slot.silent = True
            self.reservations.pop(worker_id, None)

    def drain(self, worker_id: str) -> list[Placement]:
        """The worker's node is being drained: out of placement for good (a task that reserved
        it reserves another); returns what is placed on it, to be taken back."""
        slot = self.slots.get(worker_id)
        if slot is not None:
            slot.draining = True
            self.reservations.pop(worker_id, None)
        return [p for p in self.placed.values() if p.worker_id == worker_id]

    def placeable(self) -> list[Slot]:
        return [slot for slot in self.slots.values() if not slot.silent and not slot.draining]

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
        workspace: str = DEFAULT_WORKSPACE,
        borrow: bool = False,
        node: str = "",
        pinned_by: str = "",
        disk_ids: tuple[str, ...] = (),
        image: str = "",
        avoid_node: str = "",
    ) -> None:
        """Queues the task (once: a repeated request changes nothing), in the order of `now`:
        its creation when the request carries it, so the queue keeps the tasks' own order."""
        if task_id in self.placed or task_id in self._ids():
            return
        waiting = Waiting(
            task_id=task_id,
            gpus=gpus,
            since=now,
            ports=ports,
            workspace=workspace,
            borrow=borrow,
            node=node,
            pinned_by=pinned_by,
            disk_ids=disk_ids,
            image=image,
            avoid_node=avoid_node,
        )
        if not self.waiting or self.waiting[-1].since <= now:
            self.waiting.append(waiting)
        else:
            # Requests travel apart, so one may come after a later task's: O(log n) to find
            # its place (a standing queue of 10,000 takes 10,000 of them in a few tasks).
            at = bisect.bisect_right(self.waiting, now, key=lambda w: w.since)
            self.waiting.insert(at, waiting)
        self._ids().add(task_id)
        self._count(waiting, +1)
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
                over = not waiting.borrow and not self._within_quota(waiting, self.held())
                reason = QUOTA if over else ""
                holder = self._disk_holder(waiting) if waiting.disk_ids else None
                if not over and holder is not None:
                    reason = f"waiting for {waiting.pinned_by or 'its disk'}: task {holder} uses it"
                elif not over and waiting.node:
                    reason = pinned_reason(waiting.pinned_by or "its disk", waiting.node)
                elif not over and waiting.avoid_node:
                    reason = f"waiting for a machine other than {waiting.avoid_node}"
                return QueueSpot(
                    position=index + 1,
                    waiting=len(self.waiting),
                    gpus=waiting.gpus,
                    most_free=self.most_free(),
                    workers=len(self.slots),
                    reason=reason,
                    workspace=waiting.workspace,
                )
        return None

    def _disk_holder(self, waiting: Waiting) -> str | None:
        """The placed task that holds one of the disks the waiting task mounts (a disk is
        mounted for one task at a time), or None."""
        wanted = set(waiting.disk_ids)
        for task_id, placement in self.placed.items():
            if wanted.intersection(placement.disk_ids):
                return task_id
        return None

    def disk_users(self, disk_id: str) -> list[str]:
        """The tasks placed or waiting that mount the disk."""
        placed = [t for t, p in self.placed.items() if disk_id in p.disk_ids]
        return placed + [w.task_id for w in self.waiting if disk_id in w.disk_ids]

    def waiting_in(self, workspace: str) -> int:
        return sum(1 for w in self.waiting if w.workspace == workspace)

    def set_share(self, workspace: str, quota: int | None, weight: float = 1.0) -> None:
        """The workspace's quota (None: no bound) and weight, from its record."""
        self.shares[workspace] = Share(quota=quota, weight=weight)

    def held(self) -> dict[str, int]:
        """Cards each workspace holds now (placed tasks, borrowed ones included)."""
        held: dict[str, int] = defaultdict(int)
        for placement in self.placed.values():
            held[placement.workspace] += len(placement.gpu_indices)
        return held

    def _within_quota(self, waiting: Waiting, held: dict[str, int]) -> bool:
        quota = self.shares.get(waiting.workspace, Share()).quota
        return quota is None or held.get(waiting.workspace, 0) + waiting.gpus <= quota

    def _share(self, workspace: str, held: dict[str, int]) -> float:
        weight = self.shares.get(workspace, Share()).weight
        return held.get(workspace, 0) / weight if weight > 0 else float("inf")

    def reclaim(self) -> list[tuple[Placement, str]]:
        """Borrowed work to take back, newest first, each with the workspace it is taken back
        for: so that the first task within its quota that waits and cannot fit gets a worker,
        on the worker where the fewest borrowed tasks free enough cards (those being taken back
        already count as freed). Marked `reclaiming` until released; empty when none waits for
        them or taking them back would not do."""
        held = self.held()
        borrowed = sorted(
            (p for p in self.placed.values() if p.borrowed and p.task_id not in self.reclaiming),
            key=lambda p: (p.since or datetime.min, p.task_id),
            reverse=True,
        )
        if not borrowed:
            return []
        for waiting in self.waiting:
            if not self._within_quota(waiting, held):
                continue
            best: list[Placement] | None = None
            for slot in self.placeable():
                if len(slot.devices) < waiting.gpus or not _on_its_node(waiting, slot):
                    continue
                freeing = sum(
                    len(cards) for task_id, cards in slot.busy.items() if task_id in self.reclaiming
                )
                free = len(slot.free()) + freeing
                taken: list[Placement] = []
                for placement in borrowed:
                    if free >= waiting.gpus:
                        break
                    if placement.worker_id == slot.worker_id:
                        taken.append(placement)
                        free += len(placement.gpu_indices)
                if free >= waiting.gpus and taken and (best is None or len(taken) < len(best)):
                    best = taken
            if best:
                for placement in best:
                    self.reclaiming[placement.task_id] = waiting.workspace
                return [(placement, waiting.workspace) for placement in best]
        return []

    def release(self, task_id: str) -> None:
        self.reclaiming.pop(task_id, None)
        placement = self.placed.pop(task_id, None)
        if placement and placement.worker_id in self.slots:
            self.slots[placement.worker_id].busy.pop(task_id, None)
        if task_id in self._ids():  # withdrawn while it waits
            self.waiting = [w for w in self.waiting if w.task_id != task_id]
            self._sizes = None
            self._ids().discard(task_id)
            if task_id in self.notify:
                self.notify.remove(task_id)
        for worker_id, holder in list(self.reservations.items()):
            if holder == task_id:
                del self.reservations[worker_id]

    def assign(self, now: datetime, reserve_after: timedelta) -> list[Placement]:
        """Places every waiting task that fits, in fair-share order (see the module), first
        within the quotas, then borrowing; returns the new placements."""
        held = self.held()
        made = self._assign_round(now, reserve_after, held, borrowing=False)
        if any(w.borrow for w in self.waiting) and not any(
            self._within_quota(w, held) for w in self.waiting
        ):
            made += self._assign_round(now, reserve_after, held, borrowing=True)
        return made

    def _assign_round(
        self, now: datetime, reserve_after: timedelta, held: dict[str, int], *, borrowing: bool
    ) -> list[Placement]:
        most_free = self.most_free()
        placeable = len(self.placeable())
        if not self.waiting or self._nothing_to_do(most_free, placeable):
            return []  # a standing queue of thousands costs nothing here, not a look per task
        if most_free == 0 and self._zero() == 0 and now - self.waiting[0].since < reserve_after:
            return []  # only a reservation could be made, and none has waited long enough
        open_free = self._open_free()
        reservers = set(self.reservations.values())
        made: list[Placement] = []
        queues: dict[str, deque[Waiting]] = defaultdict(deque)
        for waiting in self.waiting:
            queues[waiting.workspace].append(waiting)
        # The workspace holding the fewest cards for its weight first, then the oldest head.
        # A task looked at and not placed counts as held for the rest of the round, so that
        # one workspace's queue does not take every reservation while its share stays lowest.
        looked: dict[str, int] = defaultdict(int)

        def key(ws: str) -> tuple[float, datetime, str]:
            return (self._share(ws, {ws: held.get(ws, 0) + looked[ws]}), queues[ws][0].since, ws)

        heap = [key(ws) for ws in queues]
        heapq.heapify(heap)
        while heap:
            _, _, workspace = heapq.heappop(heap)
            queue = queues[workspace]
            waiting = queue.popleft()
            placed = None
            if borrowing and not waiting.borrow:
                pass
            elif not borrowing and not self._within_quota(waiting, held):
                # It waits for its workspace's cards to come back (reason `quota`); with none
                # left under the quota, so do the rest of its queue but tasks that take none.
                quota = self.shares[workspace].quota
                if quota is not None and held.get(workspace, 0) >= quota:
                    kept = [w for w in queue if w.gpus == 0] if self._zero() else []
                    queue.clear()
                    queue.extend(kept)
            else:
                # Free cards of a reserved worker go to its reserving task only: a look at the
                # workers is for a task that fits the unreserved ones, or holds a reservation.
                fits = waiting.gpus <= open_free or (
                    waiting.task_id in reservers and waiting.gpus <= most_free
                )
                busy = bool(waiting.disk_ids) and self._disk_holder(waiting) is not None
                slot = self._fit(waiting) if fits and not busy else None
                if slot is None:
                    looked[workspace] += max(waiting.gpus, 1)
                    due = now - waiting.since >= reserve_after and not busy
                    if due and self._reserve(waiting):
                        reservers.add(waiting.task_id)
                else:
                    placed = self._place(waiting, slot, borrowed=borrowing)
            if placed is not None:
                made.append(placed)
                reservers.discard(waiting.task_id)
                held[workspace] = held.get(workspace, 0) + waiting.gpus
                most_free, open_free = self.most_free(), self._open_free()
            if self._nothing_to_do(most_free, placeable):
                break  # nothing else can be placed or reserved this round
            if queue:
                heapq.heappush(heap, key(workspace))
        if made:
            taken = {p.task_id for p in made}
            self.waiting = [w for w in self.waiting if w.task_id not in taken]
        return made

    def _place(self, waiting: Waiting, slot: Slot, *, borrowed: bool) -> Placement:
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
            workspace=waiting.workspace,
            borrowed=borrowed,
            since=waiting.since,
            disk_ids=waiting.disk_ids,
        )
        self.placed[waiting.task_id] = placement
        for worker_id, holder in list(self.reservations.items()):
            if holder == waiting.task_id:
                del self.reservations[worker_id]
        self._ids().discard(waiting.task_id)
        self._count(waiting, -1)
        return placement

    def _fit(self, waiting: Waiting) -> Slot | None:
        fits = [
            slot
            for slot in self.placeable()
            if len(slot.free()) >= waiting.gpus
            and _on_its_node(waiting, slot)
            and self.reservations.get(slot.worker_id, waiting.task_id) == waiting.task_id
            and not (waiting.ports and self._published(slot) & set(waiting.ports))
        ]
        # A worker whose node holds the task's image first (no pull), then the tightest fit.
        return min(
            fits,
            key=lambda s: (not _holds(s, waiting), len(s.free()), s.worker_id),
            default=None,
        )

    def _published(self, slot: Slot) -> set[int]:
        """Ports the tasks placed on the worker publish."""
        return {
            port
            for task_id in slot.busy
            if (placed := self.placed.get(task_id)) is not None
            for port in placed.ports
        }

    def _open_free(self) -> int:
        """The most cards free on one worker that no task has reserved."""
        return max(
            (len(s.free()) for s in self.placeable() if s.worker_id not in self.reservations),
            default=0,
        )

    def _reserve(self, waiting: Waiting) -> bool:
        """Whether it reserved a worker now (only a task that `_reserves`)."""
        if not _reserves(waiting) or waiting.task_id in self.reservations.values():
            return False
        able = [
            slot
            for slot in self.placeable()
            if slot.could_hold(waiting.gpus)
            and slot.worker_id not in self.reservations
            and _on_its_node(waiting, slot)
        ]
        if able:
            # The one that can hold it soonest: most cards of its own, then most free.
            best = max(able, key=lambda s: (len(s.devices), len(s.free()), s.worker_id))
            self.reservations[best.worker_id] = waiting.task_id
            return True
        return False


def _reserves(waiting: Waiting) -> bool:
    """Whether a task that waits long reserves a worker: one that takes more than one card (a
    stream of smaller tasks could take each card as it frees), or publishes ports (a task on
    the worker may hold them). A one-card task never does: whatever card frees next fits it,
    and the fair-share order gives it its turn, which a reservation would override."""
    return waiting.gpus > 1 or bool(waiting.ports)


def _on_its_node(waiting: Waiting, slot: Slot) -> bool:
    """Whether the task may run on the worker: any, unless a disk pins it to one node, or it
    is to run elsewhere than one."""
    if waiting.avoid_node and slot.node_name == waiting.avoid_node:
        return False
    return not waiting.node or slot.node_name == waiting.node


def _holds(slot: Slot, waiting: Waiting) -> bool:
    """Whether the worker's node's cache holds the task's image (as its agent reported)."""
    return bool(waiting.image) and waiting.image in slot.images
