"""Soak with faults: a bounded load of tasks and an endpoint under steady traffic while the
controlplane (worker_main), one worker agent, the Temporal dev server and the sandbox's
Kubernetes API are each killed and started again, in turn. It counts what a user would: tasks
submitted, succeeded, lost (not succeeded once the drain is over) and run twice (two starts
of one task's command); endpoint requests, 5xx, connection errors and hung (no answer within
the client's timeout); and the longest gap with no task completing, and with no request
answered 200.

    python benchmarks/faults.py [--tasks 150] [--duration 300] [--task-seconds 3]
        [--fault-every 30] [--down 3] [--rate 4] [--client-timeout 30]
        [--endpoint-timeout 20s] [--seed 7] [--dir DIR]

What runs is tests/reliability/world.py's world: the Temporal dev server (sqlite) and
`python -m worker_main` as processes of their own, the sandbox cluster in this one (3 GPU
nodes, 5 free cards). The faults, one every `--fault-every` seconds, the four kinds in a seeded
order, each kind once before any twice:

- controlplane: worker_main SIGKILLed, started again after `--down` s (same settings and ports);
- temporal: the dev server SIGKILLed, started again on its sqlite file after `--down` s;
- agent: one worker agent SIGKILLed (its pod's process; alternately the agent holding the
  endpoint's replica and one running a task), then whatever the sandbox's kubelet, Job
  controller and the controlplane do, as on Kubernetes;
- sandbox: the Kubernetes API's process killed (`Sandbox.crash`: its port closed, every
  watch and connection cut, requests in flight unanswered; its store, etcd, kept), serving
  again on the same port after `--down` s.

The tasks (one card each, `sh -c`: a line with the time into a file of their own, then
`--task-seconds` of sleep) are submitted evenly over `--duration` s; the endpoint (one card,
`--min-replicas 1`, `--request-timeout` of `--endpoint-timeout`, Python's http.server) gets
`--rate` GETs a second through the endpoints front with the operator token. Then up to 180 s
for the last tasks to end. The directory (`--dir`, else a new one under /tmp) is kept: the
dev server's and worker_main's logs, every pod's output (`pods/`: the agents'), each task's
starts (`task-runs/`). `left_running_by_killed_agents` is what the killed agents' work dirs
still ran at the end (the sandbox removes it as it stops).
Not part of `make test`; exit status 1 when a task was lost or ran twice, or a request hung.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError

from levers9 import logs
from levers9.models import TERMINAL, TaskInput, TaskRecord, task_workflow_id
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task, task_record
from levers9.tokens import operator_token
from sandbox import strays
from sandbox.synthetic import cpu_model
from tests.controlplane import POOL
from tests.factories import HTTP_TASK
from tests.reliability.world import BIN, TOKEN_SECRET, World, agent_pid, settled, world

KINDS = ("controlplane", "temporal", "agent", "sandbox")
ENDPOINT = "soak"
DRAIN_S = 180.0
RETRY_S = 1.0


@dataclass
class Fault:
    kind: str
    at_s: float
    target: str = ""
    back_s: float | None = None
    """When it served again (the process polling, the server answering); None for an agent,
    which the cluster and the controlplane replace on their own."""


@dataclass
class Task:
    task_id: str
    submitted_s: float = 0.0
    ended_s: float | None = None
    record: TaskRecord | None = None


@dataclass
class Request:
    sent_s: float
    answered_s: float | None = None
    outcome: str = ""
    """"200", another status, "error: <kind>" (refused, reset), or "hung"."""
    detail: str = ""
    """What a request not answered 200 was told: the body, or the error."""


@dataclass
class Soak:
    w: World
    rng: random.Random
    began: float = field(default_factory=time.monotonic)
    tasks: list[Task] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    task_seconds: float = 3.0
    load_began: float = 0.0
    replica: str = ""
    """The endpoint's replica (task id) that last answered."""

    def now(self) -> float:
        return time.monotonic() - self.began

    def since(self, epoch: float) -> float:
        """A wall-clock time (a task's own `date`) as seconds since the soak began."""
        return epoch - time.time() + self.now()

    async def record(self, task_id: str) -> TaskRecord | None:
        """The record by query, or None when it cannot be read now."""
        assert self.w.client is not None
        with contextlib.suppress(RPCError, RuntimeError, TimeoutError):
            return await asyncio.wait_for(task_record(self.w.client, task_id), 15)
        return None

    def command(self, task_id: str) -> tuple[str, ...]:
        runs = self.w.task_runs / task_id
        line = f'echo "run $(date +%s.%N)" >> {runs}'
        return ("sh", "-c", f"{line}; sleep {self.task_seconds:g}; echo done")

    # -- tasks -----------------------------------------------------------------------------

    async def submit(self, task: Task) -> None:
        """Starts the task's record, again until Temporal takes it (a start whose answer was
        lost is already started)."""
        task.submitted_s = self.now()
        spec = TaskInput(task_id=task.task_id, pool_name=POOL, command=self.command(task.task_id))
        while True:
            assert self.w.client is not None
            try:
                await asyncio.wait_for(
                    start_task(self.w.client, self.w.settings.task_queue, spec), 30
                )
                return
            except WorkflowAlreadyStartedError:
                return
            except (RPCError, RuntimeError, TimeoutError):
                await asyncio.sleep(RETRY_S)

    async def follow(self, task: Task) -> None:
        """Waits on the record's result (long-polled), through every fault."""
        while True:
            assert self.w.client is not None
            handle = self.w.client.get_workflow_handle(
                task_workflow_id(task.task_id), result_type=TaskRecord
            )
            try:
                task.record = await asyncio.wait_for(handle.result(), 60)
            except WorkflowFailureError:
                task.record = await self.record(task.task_id)
            except (RPCError, RuntimeError, TimeoutError):
                await asyncio.sleep(RETRY_S)
                continue
            task.ended_s = self.now()
            return

    async def load(
        self, count: int, duration_s: float, followers: list[asyncio.Task[None]]
    ) -> None:
        for n in range(count):
            await asyncio.sleep(max(0.0, n * duration_s / count - self.now() + self.load_began))
            task = Task(f"fault{n:04d}")
            self.tasks.append(task)
            await self.submit(task)
            followers.append(asyncio.create_task(self.follow(task)))

    # -- the endpoint ----------------------------------------------------------------------

    async def get(self, session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        request = Request(self.now())
        self.requests.append(request)
        headers = {"Authorization": f"Bearer {operator_token(TOKEN_SECRET)}"}
        try:
            async with asyncio.timeout(timeout_s):
                async with session.get(url, headers=headers) as response:
                    body = await response.text()
            request.outcome = str(response.status)
            if response.status == 200:
                self.replica = body.split()[2]
            else:
                request.detail = body[:300]
        except TimeoutError:
            request.outcome = "hung"
            return
        except (aiohttp.ClientError, OSError) as error:
            request.outcome = f"error: {type(error).__name__}"
            request.detail = str(error)[:300]
        request.answered_s = self.now()

    async def traffic(self, url: str, rate: float, until_s: float, timeout_s: float) -> None:
        sent: list[asyncio.Task[None]] = []
        async with aiohttp.ClientSession() as session:
            n = 0
            start = self.now()
            while (at := start + n / rate) < until_s:
                await asyncio.sleep(max(0.0, at - self.now()))
                sent.append(asyncio.create_task(self.get(session, url, timeout_s)))
                n += 1
            await asyncio.gather(*sent)

    # -- faults ----------------------------------------------------------------------------

    async def inject(self, kind: str, down_s: float) -> Fault:
        fault = Fault(kind, self.now())
        self.faults.append(fault)
        w = self.w
        if kind == "controlplane":
            w.controlplane.kill9()
            await asyncio.sleep(down_s)
            w.controlplane.start()
            await w.controlplane_ready()
        elif kind == "temporal":
            w.temporal.kill9()
            await asyncio.sleep(down_s)
            w.temporal.start()
            await w.temporal_ready()
        elif kind == "sandbox":
            await w.sandbox.sandbox.crash()
            await asyncio.sleep(down_s)
            await w.sandbox.sandbox.serve_again()
        else:
            fault.target = await self.kill_an_agent()
            return fault
        fault.back_s = self.now()
        return fault

    async def kill_an_agent(self) -> str:
        """SIGKILLs the agent holding the endpoint's replica on every other call, else one
        running a task, found newest first so that it still runs at the kill (else any); the
        target names what its record said it ran."""
        records = await list_worker_records(self.w.settings, POOL, include_ended=False)
        available = sorted(r.worker_id for r in records if r.state == "available")
        victim, held = "", ""
        if sum(1 for f in self.faults if f.kind == "agent") % 2 == 1 and self.replica:
            replica = await self.record(self.replica)
            if replica is not None and replica.worker_id in available:
                victim, held = replica.worker_id, f"replica {self.replica}"
        for task in [t for t in self.tasks if t.ended_s is None][::-1][:8]:
            if victim:
                break
            record = await self.record(task.task_id)
            if record is not None and record.state == "running" and record.worker_id:
                victim, held = record.worker_id, task.task_id
        victim = victim or self.rng.choice(available)
        pid = await asyncio.to_thread(agent_pid, victim)
        os.kill(pid, signal.SIGKILL)
        self.faults[-1].at_s = self.now()  # the kill, after the look-ups above
        return f"{victim} ({held or 'idle'})"

    async def fault_loop(self, every_s: float, until_s: float, down_s: float) -> None:
        order: list[str] = []
        at = self.now() + every_s / 2
        while at < until_s:
            if not order:
                order = list(KINDS)
                self.rng.shuffle(order)
            await asyncio.sleep(max(0.0, at - self.now()))
            fault = await self.inject(order.pop(0), down_s)
            print(f"+{fault.at_s:6.1f}s {fault.kind} {fault.target}".rstrip(), file=sys.stderr)
            at += every_s


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch in [start, end] with no time in `times`: (length, its start)."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    length, at = max((b - a, a) for a, b in itertools.pairwise(points))
    return round(length, 1), round(at, 1)


def faults_in(faults: list[Fault], gap: tuple[float, float]) -> str:
    """The faults from a second before a gap began to its end: what it followed."""
    length, at = gap
    named = [f"{f.kind} at +{f.at_s:.1f}s" for f in faults if at - 1 <= f.at_s <= at + length]
    return f"from +{at}s, during: {', '.join(named) or 'no fault'}"


def last_fault_before(faults: list[Fault], at: float) -> str:
    before = [f for f in faults if f.at_s <= at]
    return f"{before[-1].kind} at +{before[-1].at_s:.1f}s" if before else "none"


def first_after(times: list[float], at: float) -> float | None:
    """Seconds from `at` to the first of `times` after it."""
    later = [t for t in times if t > at]
    return round(min(later) - at, 1) if later else None


def keep_pod_logs(w: World, directory: Path) -> None:
    """Every pod's output also appended to `pods/<pod>.log`: the sandbox forgets a deleted
    pod's (a killed agent's Job is deleted), and its agent's log says what became of its tasks."""
    logs_dir = directory / "pods"
    logs_dir.mkdir(exist_ok=True)
    cluster_logs = w.sandbox.cluster.logs
    write = cluster_logs.write

    def tee(namespace: str, pod: str, container: str, text: str) -> None:
        write(namespace, pod, container, text)
        with (logs_dir / f"{pod}.log").open("a") as out:
            out.write(text)

    cluster_logs.write = tee  # type: ignore[method-assign]


async def endpoint_create(w: World, port: int, request_timeout: str) -> None:
    """As a user creates it: one card, one replica at least, the operator's CLI."""
    env = {
        **w.cli_env(next(iter(w.replicas))),
        "KUBECONFIG": str(w.sandbox.state.dir / "kubeconfig"),
    }
    argv = [str(BIN / "levers9"), "endpoint", "create", ENDPOINT, "--pool", POOL]
    argv += ["--gpus", "1", "--port", str(port), "--min-replicas", "1"]
    argv += ["--request-timeout", request_timeout, "--", "python", "-c", HTTP_TASK]
    done = await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        raise SystemExit(f"endpoint create failed: {done.stdout}{done.stderr}")


async def first_answer(soak: Soak, url: str, timeout_s: float) -> float:
    """Seconds until the endpoint first answers 200 (its replica started from zero)."""
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while not soak.replica:
            await soak.get(session, url, timeout_s)
            if time.monotonic() - began > 120:
                raise SystemExit(f"the endpoint never answered: {soak.requests[-1].outcome}")
            await asyncio.sleep(0.5 if not soak.replica else 0)
    soak.requests.clear()
    return time.monotonic() - began


def trouble(soak: Soak, task: Task, runs: int) -> dict[str, object]:
    """What is known of a task that did not succeed once: to find out why."""
    record = task.record
    lines = (soak.w.task_runs / task.task_id).read_text().split() if runs else []
    return {
        "task": task.task_id,
        "state": record.state if record is not None else "unknown",
        "reason": record.reason if record is not None else "",
        "worker": record.worker_id if record is not None else None,
        "runs": runs,
        "started_at_s": [round(soak.since(float(t)), 1) for t in lines[1::2]],
        "submitted_s": round(task.submitted_s, 1),
        "ended_s": round(task.ended_s, 1) if task.ended_s is not None else None,
        "last_fault_before_submit": last_fault_before(soak.faults, task.submitted_s),
    }


async def task_figures(soak: Soak, load_end: float) -> dict[str, object]:
    """Each task's record as it is now, and how many times its command started."""
    for task in soak.tasks:
        if task.record is None or task.record.state not in TERMINAL:
            task.record = await soak.record(task.task_id) or task.record
    states = Counter(t.record.state if t.record is not None else "unknown" for t in soak.tasks)
    runs = {t.task_id: soak.w.runs(t.task_id) for t in soak.tasks}
    ended = [t.ended_s for t in soak.tasks if t.ended_s is not None]
    gap = longest_gap(ended, soak.load_began, load_end)
    return {
        "tasks_submitted": len(soak.tasks),
        "tasks_succeeded": states["succeeded"],
        "tasks_lost": len(soak.tasks) - states["succeeded"],
        "tasks_run_twice": sum(1 for n in runs.values() if n > 1),
        "tasks_never_started": sum(1 for n in runs.values() if n == 0),
        "task_states": dict(states),
        "longest_gap_no_task_completing_s": gap[0],
        "longest_gap_no_task_completing": faults_in(soak.faults, gap),
        "trouble": [
            trouble(soak, t, runs[t.task_id])
            for t in soak.tasks
            if t.record is None or t.record.state != "succeeded" or runs[t.task_id] != 1
        ],
    }


def request_figures(soak: Soak, load_end: float) -> dict[str, object]:
    outcomes = Counter(r.outcome for r in soak.requests)
    answered = [r.answered_s for r in soak.requests if r.outcome == "200" and r.answered_s]
    gap = longest_gap(answered, soak.load_began, load_end)
    return {
        "requests": len(soak.requests),
        "requests_5xx": sum(n for o, n in outcomes.items() if o.startswith("5")),
        "requests_hung": outcomes["hung"],
        "request_outcomes": dict(outcomes),
        "request_examples": {
            outcome: next(r.detail for r in soak.requests if r.outcome == outcome)
            for outcome in outcomes
            if outcome not in ("200", "hung")
        },
        "hung_sent_at_s": [round(r.sent_s, 1) for r in soak.requests if r.outcome == "hung"],
        "longest_gap_no_request_answered_s": gap[0],
        "longest_gap_no_request_answered": faults_in(soak.faults, gap),
    }


def fault_figures(soak: Soak) -> list[dict[str, object]]:
    """Each fault, when its process served again, and how long until a task ended and a
    request sent after it was answered 200."""
    ended = [t.ended_s for t in soak.tasks if t.ended_s is not None]
    answered = [
        (r.sent_s, r.answered_s) for r in soak.requests if r.outcome == "200" and r.answered_s
    ]
    return [
        {
            "kind": f.kind,
            "at_s": round(f.at_s, 1),
            "back_after_s": round(f.back_s - f.at_s, 1) if f.back_s is not None else None,
            "next_task_end_after_s": first_after(ended, f.at_s),
            "next_200_after_s": first_after([a for s, a in answered if s > f.at_s], f.at_s),
            **({"target": f.target} if f.target else {}),
        }
        for f in soak.faults
    ]


async def run(args: argparse.Namespace, directory: Path) -> dict[str, object]:
    logs.setup("WARNING", sys.stderr)
    load_at_start = os.getloadavg()[0]  # the machine is shared: how busy it was
    async with world(directory) as w:
        keep_pod_logs(w, directory)
        await settled(w)
        soak = Soak(w, random.Random(args.seed), task_seconds=args.task_seconds)
        # Not from the seed: a replica left running by an earlier run's killed agent may
        # still hold that port on its node.
        port = random.SystemRandom().randrange(20000, 30000)
        await endpoint_create(w, port, args.endpoint_timeout)
        url = f"http://{w.controlplane.env['LEVERS9_ENDPOINTS_LISTEN']}/{ENDPOINT}/soak"
        cold_s = await first_answer(soak, url, args.client_timeout)
        print(f"settled; the endpoint answered in {cold_s:.1f}s; load begins", file=sys.stderr)
        soak.load_began = soak.now()
        end = soak.load_began + args.duration
        followers: list[asyncio.Task[None]] = []
        await asyncio.gather(
            soak.load(args.tasks, args.duration, followers),
            soak.traffic(url, args.rate, end, args.client_timeout),
            soak.fault_loop(args.fault_every, end - 10, args.down),
        )
        print(f"+{soak.now():6.1f}s load over; draining", file=sys.stderr)
        _, pending = await asyncio.wait(followers, timeout=DRAIN_S)
        for follower in pending:
            follower.cancel()
        drained_s = soak.now()
        left = strays.find(w.sandbox.state.dir, stack_running=True)
        figures = {
            **await task_figures(soak, end),
            **request_figures(soak, end),
            "faults": fault_figures(soak),
            "left_running_by_killed_agents": sorted(
                f"{s.kind} {s.name}" for s in left if s.kind in ("process", "container")
            ),
            "cold_start_s": round(cold_s, 1),
            "load_began_s": round(soak.load_began, 1),
            "load_s": round(end - soak.load_began, 1),
            "drained_at_s": round(drained_s, 1),
            "directory": str(directory),
            "loadavg_at_start": round(load_at_start, 2),
            "loadavg_at_end": round(os.getloadavg()[0], 2),
            "nproc": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
        }
    return figures  # what the killed agents left, the sandbox removed as it stopped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=150, help="tasks submitted over --duration")
    parser.add_argument("--duration", type=float, default=300, help="seconds of load and faults")
    parser.add_argument("--task-seconds", type=float, default=3, help="how long each task runs")
    parser.add_argument("--fault-every", type=float, default=30, help="seconds between faults")
    parser.add_argument("--down", type=float, default=3, help="seconds a killed process stays down")
    parser.add_argument("--rate", type=float, default=4, help="endpoint requests a second")
    parser.add_argument(
        "--client-timeout", type=float, default=30, help="seconds before a request counts as hung"
    )
    parser.add_argument(
        "--endpoint-timeout", default="20s", help="the endpoint's --request-timeout"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where the logs are kept")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="levers9-faults-"))
    # This process's Temporal clients retry through every fault: their core's warnings for
    # each retried call would bury the figures.
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet))))
    result = asyncio.run(run(args, directory))
    print(json.dumps(result, indent=2))
    bad = result["tasks_lost"] or result["tasks_run_twice"] or result["requests_hung"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
