"""An endpoint's replicas and its autoscaler (pure; EndpointWorkflow's state).

An endpoint (`levers9 endpoint create NAME --image ... --port 8080 --gpus N -- CMD`) is an HTTP
service the controlplane's gateway serves at `<endpoints URL>/<name>/`, proxying each request to
one of its replicas, which are tasks (`TaskWorkflow`s with `endpoint` set) publishing the port.

The gateways report the requests they hold (signal `load`: in flight on replicas, and waiting
for one); the autoscaler keeps the replicas between `min_replicas` and `max_replicas`:

- wanted = ceil((in flight + waiting) / `target_in_flight`), at least one while a request
  waits, clamped to [min, max];
- more wanted than active: start replicas now (`cold start` when there was none, else
  `scale up`);
- fewer wanted than active, for `idle_seconds` on end: stop the surplus (`scale down`, to zero
  when min is 0). A replica that is starting is never stopped for want of requests: a request
  waits for it, or will (the page's failure is exactly that: stopped at zero in flight, its
  image pull cancelled);
- a replica that ends before it was ready counts as a failure; after `FAILING_AFTER` in a row
  the endpoint is `failing` (the gateways answer waiting requests 503 with its reason) and new
  replicas start with backoff, until one is ready.

Reports older than `LOAD_STALE` (a gateway that died holding requests) count for nothing.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from levers9.core.workspaces import DEFAULT_WORKSPACE

LOAD_STALE = timedelta(seconds=30)
"""A gateway repeats its report every 10 s while it holds requests; older ones are dropped."""
FAILING_AFTER = 3
BACKOFF = (timedelta(seconds=10), timedelta(minutes=5))
MAX_EVENTS = 50
"""Scale decisions kept in the state (and shown by `levers9 endpoint get`)."""

ReplicaState = Literal["starting", "ready", "stopping"]


class EndpointSpec(BaseModel):
    """What `levers9 endpoint create` asks for."""

    model_config = ConfigDict(frozen=True)

    name: str
    pool_name: str
    command: tuple[str, ...]
    port: int = Field(ge=1, le=65535)
    image: str = ""
    gpus: int = Field(default=1, ge=0)
    env: dict[str, str] = Field(default_factory=dict)
    memory_bytes: int = 0
    cpu_millis: int = 0
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    target_in_flight: int = Field(default=4, ge=1)
    """Requests one replica takes at once before another is wanted."""
    idle_seconds: float = Field(default=300.0, gt=0)
    """A surplus replica (all of them at zero requests) stops after this."""
    ready_path: str = ""
    """"" : ready when the port accepts connections; a path: when a GET of it answers 2xx."""
    cold_start_timeout_seconds: float = Field(default=1500.0, gt=0)
    """How long a gateway holds a request that waits for a replica (a 20 GB image, a model
    loaded from scratch): then 503."""
    request_timeout_seconds: float = Field(default=1500.0, gt=0)
    """How long a gateway gives a request, from its arrival to its response's end, a cold
    start included (the page's `curl -m 1500`): then 504, or a cut transfer once the response
    has begun."""
    public: bool = False
    """Requests need no token; else `Authorization: Bearer <token>`, the operator's or one of
    the endpoint's workspace."""
    workspace: str = DEFAULT_WORKSPACE
    """The workspace it belongs to: its replicas are that workspace's tasks (its quota counts
    their cards), and only its tokens (and the operator's) reach it."""
    borrow: bool = False
    """Its replicas may run past the workspace's GPU quota on cards nobody within quota waits
    for (`--borrow`), and are the first taken back (a replica taken back is started again)."""


class Replica(BaseModel):
    task_id: str
    state: ReplicaState = "starting"
    started_at: datetime
    ready_at: datetime | None = None


class Load(BaseModel):
    """One gateway's report (signal `load`)."""

    gateway: str
    in_flight: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    at: datetime | None = None
    """Set by the workflow when it takes the report (its own clock)."""


class ScaleEvent(BaseModel):
    at: datetime
    kind: str
    """cold start, scale up, scale down, ready, replica ended, failing."""
    message: str


class Decision(BaseModel):
    start: int = 0
    stop: list[str] = Field(default_factory=list)
    kind: str = ""
    message: str = ""


class EndpointState(BaseModel):
    """Everything EndpointWorkflow knows; carried across continue-as-new as it is."""

    spec: EndpointSpec
    created_at: datetime
    replicas: dict[str, Replica] = Field(default_factory=dict)
    loads: dict[str, Load] = Field(default_factory=dict)
    events: list[ScaleEvent] = Field(default_factory=list)
    surplus_since: datetime | None = None
    last_busy: datetime | None = None
    failures: int = 0
    """Replicas in a row that ended before they were ready."""
    failing: str = ""
    """Why replicas fail before ready (set after FAILING_AFTER in a row)."""
    next_start_at: datetime | None = None
    """Backoff: no replica starts before this while failing."""
    cold_starts: int = 0
    deleted: bool = False

    # -- what the gateways and the CLI read ----------------------------------------------------

    def demand(self, now: datetime) -> tuple[int, int]:
        """(in flight, waiting) summed over the gateways' fresh reports."""
        fresh = [load for load in self.loads.values() if load.at and now - load.at < LOAD_STALE]
        return sum(load.in_flight for load in fresh), sum(load.waiting for load in fresh)

    def ready(self) -> list[str]:
        return [r.task_id for r in self.replicas.values() if r.state == "ready"]

    def active(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state != "stopping"]

    # -- what changes it ---------------------------------------------------------------------

    def take_load(self, load: Load, now: datetime) -> None:
        self.loads[load.gateway] = load.model_copy(update={"at": now})
        for gateway, old in list(self.loads.items()):
            if old.at is None or now - old.at >= LOAD_STALE:
                del self.loads[gateway]

    def replica_ready(self, task_id: str, now: datetime) -> None:
        replica = self.replicas.get(task_id)
        if replica is None or replica.state != "starting":
            return
        replica.state = "ready"
        replica.ready_at = now
        self.failures = 0
        self.failing = ""
        self.next_start_at = None
        took = (now - replica.started_at).total_seconds()
        self.note(now, "ready", f"replica {task_id} ready after {took:.1f} s")

    def replica_ended(self, task_id: str, state: str, reason: str, now: datetime) -> None:
        replica = self.replicas.pop(task_id, None)
        if replica is None:
            return
        why = f": {reason}" if reason else ""
        if replica.state == "stopping":
            self.note(now, "replica ended", f"replica {task_id} stopped ({state})")
            return
        self.note(now, "replica ended", f"replica {task_id} ended {state}{why}")
        if replica.state == "starting":
            self.failures += 1
            if self.failures >= FAILING_AFTER:
                self.failing = (
                    f"{self.failures} replicas in a row ended before they were ready; the last"
                    f" ended {state}{why}"
                )
                first, longest = BACKOFF
                delay = min(first * 2 ** (self.failures - FAILING_AFTER), longest)
                self.next_start_at = now + delay
                self.note(now, "failing", f"{self.failing}; next replica in {delay.seconds} s")

    def started(self, task_id: str, now: datetime) -> None:
        self.replicas[task_id] = Replica(task_id=task_id, started_at=now)

    def stopping(self, task_id: str) -> None:
        if task_id in self.replicas:
            self.replicas[task_id].state = "stopping"

    def note(self, now: datetime, kind: str, message: str) -> None:
        self.events.append(ScaleEvent(at=now, kind=kind, message=message))
        del self.events[:-MAX_EVENTS]

    # -- the autoscaler ----------------------------------------------------------------------

    def wanted(self, now: datetime) -> int:
        in_flight, waiting = self.demand(now)
        spec = self.spec
        want = math.ceil((in_flight + waiting) / spec.target_in_flight)
        if waiting:
            want = max(want, 1)
        return max(spec.min_replicas, min(want, spec.max_replicas))

    def decide(self, now: datetime) -> Decision:
        """What to do now (the caller starts and stops, then calls `started`/`stopping`)."""
        in_flight, waiting = self.demand(now)
        if in_flight or waiting:
            self.last_busy = now
        want = self.wanted(now)
        active = self.active()
        if want > len(active):
            self.surplus_since = None
            if self.next_start_at is not None and now < self.next_start_at:
                return Decision()
            start = want - len(active)
            if not active and (waiting or in_flight):
                # From zero (requests counted in flight here were at a replica that has just
                # gone: the gateways send them on, to wait for this one).
                kind = "cold start"
                message = (
                    f"{waiting + in_flight} request(s) waiting and no replica: starting {start}"
                )
            elif want <= self.spec.min_replicas:
                kind, message = "scale up", f"min replicas {self.spec.min_replicas}"
            else:
                kind = "scale up"
                message = (
                    f"{in_flight} in flight, {waiting} waiting for {len(active)} replica(s)"
                    f" (target {self.spec.target_in_flight} each): {len(active)} -> {want}"
                )
            return Decision(start=start, kind=kind, message=message)
        if want == len(active):
            self.surplus_since = None
            return Decision()
        if self.surplus_since is None:
            self.surplus_since = now
        idle = timedelta(seconds=self.spec.idle_seconds)
        if now - self.surplus_since < idle:
            return Decision()
        # The surplus, the newest ready first; a starting replica is never stopped for idling,
        # and a ready one only once it has been ready for the idle time itself.
        ready = sorted(
            (
                r
                for r in active
                if r.state == "ready" and now - (r.ready_at or r.started_at) >= idle
            ),
            key=lambda r: (r.ready_at or r.started_at, r.task_id),
            reverse=True,
        )
        stop = [r.task_id for r in ready[: len(active) - want]]
        if not stop:
            return Decision()
        self.surplus_since = None
        quiet = f"{in_flight} in flight for {self.spec.idle_seconds:g} s"
        return Decision(
            stop=stop,
            kind="scale down",
            message=f"{quiet}: {len(active)} -> {len(active) - len(stop)}",
        )

    def next_wake(self, now: datetime) -> timedelta | None:
        """When `decide` could decide otherwise without a new report: the idle time running
        out (for the surplus, then for each ready replica's own), a backoff ending, or a
        report going stale. None: only a report can change anything."""
        idle = timedelta(seconds=self.spec.idle_seconds)
        times: list[datetime] = []
        if self.surplus_since is not None:
            times.append(self.surplus_since + idle)
            times += [
                r.ready_at + idle
                for r in self.replicas.values()
                if r.state == "ready" and r.ready_at is not None
            ]
        if self.next_start_at is not None:
            times.append(self.next_start_at)
        times += [load.at + LOAD_STALE for load in self.loads.values() if load.at is not None]
        future = [t for t in times if t > now]
        if not future:
            return None
        return max(min(future) - now, timedelta(milliseconds=100))


class EndpointView(BaseModel):
    """What `levers9 endpoint get -o json` prints and the gateways read (query `view`)."""

    name: str
    spec: EndpointSpec
    created_at: datetime
    replicas: list[Replica]
    in_flight: int
    waiting: int
    wanted: int
    failing: str = ""
    cold_starts: int = 0
    events: list[ScaleEvent]
    deleted: bool = False

    def replicas_ready(self) -> list[str]:
        return [r.task_id for r in self.replicas if r.state == "ready"]

    @classmethod
    def of(cls, state: EndpointState, now: datetime) -> EndpointView:
        in_flight, waiting = state.demand(now)
        return cls(
            name=state.spec.name,
            spec=state.spec,
            created_at=state.created_at,
            replicas=list(state.replicas.values()),
            in_flight=in_flight,
            waiting=waiting,
            wanted=state.wanted(now),
            failing=state.failing,
            cold_starts=state.cold_starts,
            events=state.events,
            deleted=state.deleted,
        )


class ReplicaEnvironment(BaseModel):
    """The argument of the activity `replica_environment`."""

    pool_name: str
    env: dict[str, str] = Field(default_factory=dict)


COMPUTE_CAPABILITY = {
    "rtxpro6000": 12.0,
    "rtx-pro-6000": 12.0,
    "b200": 10.0,
    "b100": 10.0,
    "gb200": 10.0,
    "h200": 9.0,
    "h100": 9.0,
    "l40s": 8.9,
    "l4": 8.9,
    "a100": 8.0,
    "a10g": 8.6,
    "t4": 7.5,
    "v100": 7.0,
}
"""NVIDIA's compute capabilities, by the pool's `gpuType` (as the page and GKE name cards)."""


def compute_capability(gpu_type: str) -> float | None:
    """The compute capability of a pool's cards, from its `gpuType` (`RTXPro6000`,
    `nvidia-h100-80gb`, `B200`); None when the name is not one we know."""
    name = gpu_type.lower().removeprefix("nvidia-")
    if name in COMPUTE_CAPABILITY:
        return COMPUTE_CAPABILITY[name]
    best = max((k for k in COMPUTE_CAPABILITY if name.startswith(k)), key=len, default=None)
    return COMPUTE_CAPABILITY[best] if best else None


def vllm_environment(env: dict[str, str], compute_capability: float | None) -> dict[str, str]:
    """The page's vLLM row: on compute capability 10 and above (Blackwell) vLLM prefers
    FlashInfer, whose Blackwell decode path is newer than most images'; default
    `VLLM_ATTENTION_BACKEND=TRITON_ATTN` there, unless the user set it."""
    if compute_capability is None or compute_capability < 10 or "VLLM_ATTENTION_BACKEND" in env:
        return env
    return {**env, "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
