"""Records tests/reliability/histories/ again, with the current workflow code: a `levers9 dev
demo` stack in a home of its own, then what a user and a failing node do to it, each history
saved as `temporal workflow show -o json` prints it ({"workflowId": ..., "history": ...}).

    .venv/bin/python -m tests.reliability.record_histories [--out DIR]

What it drives, after the demo (attach, egress, the pool's machines and workers, the GPU check,
a task):

- a burst of tasks, more than the workers hold at once (the pool's batched `requests`, a queue);
- an endpoint: created, one request held through its cold start, its replica stopped idle, deleted;
- a joined cluster: `cluster join --apply` (the agent's exchange), then `cluster leave --apply`;
- new settings told to a machine (the `settings` signal a reconcile pass sends when the values
  change), which tells its worker;
- a worker's agent killed with SIGKILL (its record ends by its machine's `job_finished`, and the
  machine starts the next one), and a worker whose Job is deleted (its liveness window finds it).

Read every file before you commit it: histories hold node names, addresses and image names,
never a key or token (tests/reliability/test_demo_secrets.py checks a demo's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from levers9.core.manifests import worker_job_name
from levers9.models import WorkerTimings
from tests.devstack import BIN, Dev
from tests.factories import HTTP_TASK
from tests.reliability.world import agent_pid

HISTORIES = Path(__file__).parent / "histories"
POOL = "gke-rtx6000"
CLUSTER = "rec-joined"
ENDPOINT = "rec"


def _until(check: Callable[[], Any], within: float, what: str) -> Any:
    """`check()` once it is truthy; fails after `within` seconds naming `what`."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within} s")
        time.sleep(1)


class Recorder:
    def __init__(self, dev: Dev, out: Path) -> None:
        self.dev = dev
        self.out = out

    def cli(self, *args: str, timeout: float = 120) -> str:
        done = self.dev.run(*args, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"levers9 {' '.join(args)}: {done.stdout}\n{done.stderr}")
        return done.stdout

    def workflows(self, query: str) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(
            self.dev.temporal("workflow", "list", "--query", query, "-o", "json") or "[]"
        )
        return listed

    def status(self, workflow_id: str) -> str:
        described = json.loads(
            self.dev.temporal("workflow", "describe", "-w", workflow_id, "-o", "json")
        )
        status: str = described["workflowExecutionInfo"]["status"]
        return status

    def save(self, name: str, workflow_id: str, run_id: str = "") -> None:
        show = ["workflow", "show", "-w", workflow_id, "-o", "json"]
        history = json.loads(self.dev.temporal(*show, *(["-r", run_id] if run_id else [])))
        doc = {"workflowId": workflow_id, "history": history}
        (self.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"recorded {name}: {workflow_id} ({len(history['events'])} events)", flush=True)

    def worker_records(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(
            self.cli("worker", "list", "--pool", POOL, "-o", "json")
        )
        return rows

    def available(self) -> list[dict[str, Any]]:
        return [w for w in self.worker_records() if w["state"] == "available"]

    def worker_of(self, cards: int) -> dict[str, Any]:
        """The available worker of the demo's node of 1, 2 or 4 cards (`gke-demo-gpu-4x-...`;
        the 4-card node's worker has two, a model server holds the others)."""
        [worker] = [w for w in self.available() if f"-gpu-{cards}x-" in w["node_name"]]
        return worker

    def ended(self, worker_id: str) -> dict[str, Any] | None:
        query = f"WorkflowId = 'worker:{POOL}:{worker_id}' AND ExecutionStatus = 'Completed'"
        return next(iter(self.workflows(query)), None)

    # The scenarios, in the order they run.

    def demo(self) -> None:
        done = self.dev.run("dev", "demo", *self.dev.ports, timeout=600)
        if done.returncode != 0 or "COMPLETE" not in done.stdout + done.stderr:
            raise RuntimeError(f"levers9 dev demo: {done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        self.save("AttachClusterWorkflow", self._one("AttachClusterWorkflow"))
        self.save("EgressAllowlistWorkflow", self._one("EgressAllowlistWorkflow"))
        [reconcile] = self.workflows(
            "WorkflowType = 'ReconcilePoolWorkflow' AND ExecutionStatus = 'Completed'"
        )[:1]
        self.save(
            "ReconcilePoolWorkflow",
            reconcile["execution"]["workflowId"],
            reconcile["execution"]["runId"],
        )

    def _one(self, workflow_type: str) -> str:
        [first] = self.workflows(f"WorkflowType = '{workflow_type}'")[-1:]
        workflow_id: str = first["execution"]["workflowId"]
        return workflow_id

    def burst(self) -> None:
        """More two-card tasks at once than the workers hold: some wait in the pool's queue."""
        runs = [
            subprocess.Popen(
                [
                    str(BIN / "levers9"),
                    *("run", "--pool", POOL, "--gpus", "2", "--", "sh", "-c", "sleep 3; echo done"),
                ],
                cwd=self.dev.home,
                env={**os.environ, "LEVERS9_HOME": str(self.dev.home / ".levers9")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for run in runs:
            stdout, stderr = run.communicate(timeout=180)
            if run.returncode != 0:
                raise RuntimeError(f"levers9 run: {stdout}\n{stderr}")
        [task] = self.workflows("WorkflowType = 'TaskWorkflow' AND ExecutionStatus = 'Completed'")[
            :1
        ]
        self.save("TaskWorkflow", task["execution"]["workflowId"])

    def endpoint(self) -> None:
        created = self.cli(
            "endpoint", "create", ENDPOINT, "--pool", POOL, "--gpus", "0", "--port", "8131",
            "--min-replicas", "0", "--idle", "5", "--public", "--", "python3", "-c", HTTP_TASK,
        )  # fmt: skip
        url = next(w for w in created.split() if w.startswith("http"))
        # The front serves HTTPS with the gateway's certificate.
        trust = ssl.create_default_context(cafile=self.dev.env["LEVERS9_GATEWAY_TLS_CA_FILE"])
        with urllib.request.urlopen(url, timeout=300, context=trust) as response:  # cold start
            assert response.status == 200, response.status

        def stopped_idle() -> bool:
            view = json.loads(self.cli("endpoint", "get", ENDPOINT, "-o", "json"))
            return not view.get("replicas")

        _until(stopped_idle, 120, "the endpoint's replica stopped idle")
        self.cli("endpoint", "delete", ENDPOINT)
        workflow_id = f"endpoint:{ENDPOINT}"
        _until(lambda: self.status(workflow_id).endswith("COMPLETED"), 120, "the endpoint ended")
        self.save("EndpointWorkflow", workflow_id)

    def cluster(self) -> None:
        self.cli(
            "cluster", "join", "--name", CLUSTER, "--gpu-type", "RTXPro6000",
            "--node-selector", "levers9.io/recorded=nowhere", "--simulated-gpus", "--apply",
        )  # fmt: skip

        def exchanged() -> bool:
            rows = json.loads(self.cli("cluster", "list", "-o", "json"))
            return any(r["spec"]["name"] == CLUSTER and r.get("joined_at") for r in rows)

        _until(exchanged, 120, "the cluster's agent spent its join token")
        self.cli("cluster", "leave", CLUSTER, "--apply", timeout=300)
        workflow_id = f"cluster:{CLUSTER}"
        _until(lambda: self.status(workflow_id).endswith("COMPLETED"), 120, "the join ended")
        self.save("ClusterWorkflow", workflow_id)

    def settings(self) -> None:
        """The `settings` a reconcile pass sends a machine when the values' timings change (a
        longer record TTL here: nothing else changes); the machine tells its worker."""
        worker = self.worker_of(1)
        machine_id = f"machine:{POOL}:{worker['node_name']}"
        timings = WorkerTimings(record_ttl_seconds=900).model_dump_json()
        self.dev.temporal(
            "workflow", "signal", "-w", machine_id, "--name", "settings", "--input", timings
        )
        worker_id = f"worker:{POOL}:{worker['worker_id']}"

        def signals() -> list[str]:
            events = json.loads(
                self.dev.temporal("workflow", "show", "-w", worker_id, "-o", "json")
            )
            return [
                e["workflowExecutionSignaledEventAttributes"]["signalName"]
                for e in events["events"]
                if e["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"
            ]

        def beats_after_settings() -> bool:
            names = signals()
            return "settings" in names and names[names.index("settings") :].count("heartbeat") >= 2

        # The history holds the settings, then a heartbeat or two taken under them.
        _until(beats_after_settings, 90, "two heartbeats after the machine told the settings")
        self.save("MachineWorkflow-settings", machine_id)
        self.save("WorkerWorkflow-settings", worker_id)

    def killed(self) -> None:
        """SIGKILL of a worker's agent: its Job fails, its machine's `job_finished` ends the
        record, and the machine starts the next worker."""
        victim = self.worker_of(4)
        os.kill(agent_pid(victim["worker_id"]), signal.SIGKILL)
        _until(lambda: self.ended(victim["worker_id"]), 120, "the killed worker's record ended")
        node = victim["node_name"]
        _until(
            lambda: any(w["node_name"] == node for w in self.available()),
            120,
            "the next worker on its node",
        )
        self.save("WorkerWorkflow-job-finished", f"worker:{POOL}:{victim['worker_id']}")
        self.save("MachineWorkflow-job-finished", f"machine:{POOL}:{node}")

    def job_deleted(self) -> None:
        """`kubectl delete job`: the worker falls silent, its liveness window reads the Job."""
        victim = self.worker_of(2)
        job = worker_job_name(POOL, victim["worker_id"])
        self.dev.kubectl("-n", "levers9", "delete", "job", job)
        _until(lambda: self.ended(victim["worker_id"]), 180, "the deleted Job's record ended")
        self.save("WorkerWorkflow-liveness-job-deleted", f"worker:{POOL}:{victim['worker_id']}")

    def serving(self) -> None:
        """Before the scenarios that end workers: a worker that has served a while (heartbeats,
        the memo published each minute, tasks), and its machine."""
        worker = self.worker_of(2)
        self.save("WorkerWorkflow", f"worker:{POOL}:{worker['worker_id']}")
        self.save("MachineWorkflow", f"machine:{POOL}:{worker['node_name']}")

    def pool(self) -> None:
        """Last: the pool, through all of it (its requests, placements, releases, workers
        gone and announced)."""
        self.save("PoolWorkflow", f"pool:{POOL}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HISTORIES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = Dev(Path(tempfile.mkdtemp(prefix="levers9-record-")))
    recorder = Recorder(dev, args.out)
    try:
        recorder.demo()
        recorder.burst()
        recorder.endpoint()
        recorder.cluster()
        recorder.serving()
        recorder.settings()
        recorder.killed()
        recorder.job_deleted()
        recorder.pool()
    finally:
        dev.run("dev", "down")
        shutil.rmtree(dev.home, ignore_errors=True)


if __name__ == "__main__":
    main()
