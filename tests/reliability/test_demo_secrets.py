"""After a full demo run (`levers9 dev demo`: dev up, attach, workers, the GPU check, a task),
no secret is anywhere an operator reads: every workflow history, as `temporal workflow show -o
json` prints it for each workflow `temporal workflow list` finds (payloads decoded), every log
file of the stack and every pod's log hold neither the service-account keys (the pool's, the
controlplane's own Google key) nor any token (each worker's, the operator's, the secret that
signs them) nor any TLS key (each worker's serving key, the worker CA's): zero hits. The
scanner itself is shown to find each needle where it does belong.

The same histories then replay with the current workflow code (`temporalio.worker.Replayer`):
a change that would break running workflows fails here.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from levers9.rpc.worker_tls import worker_ca
from levers9.tokens import command_digest, command_token, operator_token, worker_token
from tests.devstack import Dev
from tests.reliability.secrets_scan import corpus_of_json, hits, key_needles, pem_needles
from workflows import WORKFLOWS
from workflows.attach import AttachClusterWorkflow

pytestmark = pytest.mark.integration


class Demo:
    def __init__(self, dev: Dev, output: str) -> None:
        self.dev = dev
        self.output = output
        self.state = dev.home / ".levers9" / "dev"
        self.workflows: list[dict[str, str]] = [
            {
                "id": w["execution"]["workflowId"],
                "run": w["execution"]["runId"],
                "type": w["type"]["name"],
            }
            for w in json.loads(dev.temporal("workflow", "list", "-o", "json"))
        ]
        self.histories = {
            (w["id"], w["run"]): dev.temporal(
                "workflow", "show", "-w", w["id"], "-r", w["run"], "-o", "json"
            )
            for w in self.workflows
        }

    @functools.cache  # noqa: B019 (one Demo per module)
    def needles(self) -> dict[str, list[str]]:
        private = json.loads((self.state / "private.json").read_text())
        pool_key = private["config"]["worker"]["pools"]["gke-rtx6000"]["kubernetes"]["credentials"]
        secret = (self.state / "worker-token-secret").read_text().strip()
        worker_ids = [
            w["id"].rsplit(":", 1)[1] for w in self.workflows if w["type"] == "WorkerWorkflow"
        ]
        assert worker_ids, "the demo started no worker"
        # Each running worker's serving key, from its Secret (base64 there, as the API has it).
        listed = json.loads(self.dev.kubectl("-n", "levers9", "get", "secrets", "-o", "json"))
        serving_keys = [
            base64.b64decode(s["data"]["tls.key"]).decode()
            for s in listed["items"]
            if "tls.key" in s.get("data", {})
        ]
        assert serving_keys, "no worker Secret carries a serving key"
        ca_key = worker_ca(secret).key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return {
            "the pool's service-account key": key_needles(pool_key),
            "the controlplane's Google key": key_needles(
                (self.state / "sandbox" / "operator-key.json").read_text()
            ),
            "worker tokens": [worker_token(secret, w) for w in worker_ids],
            "command tokens": [command_token(secret, w) for w in worker_ids],
            "the operator token": [operator_token(secret)],
            "the token secret": [secret],
            "workers' serving keys": [n for key in serving_keys for n in pem_needles(key)],
            "the worker CA's key": pem_needles(ca_key.decode()),
        }


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    dev = Dev(tmp_path_factory.mktemp("demo"))
    done = dev.run("dev", "demo", *dev.ports, timeout=300)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "COMPLETE" in done.stdout + done.stderr
        # The dev pool's values say simulatedGpus: the check passes with no card, and says so.
        assert "simulated cards: no GPU was visible, as expected\nCOMPLETE {" in done.stdout
        yield Demo(dev, done.stdout + done.stderr)
    finally:
        dev.run("dev", "down")


def test_the_scanner_finds_each_secret_where_it_belongs(demo: Demo) -> None:
    needles = demo.needles()
    private = (demo.state / "private.json").read_text()
    assert hits(private, needles["the pool's service-account key"])
    assert hits(
        (demo.state / "sandbox" / "operator-key.json").read_text(),
        needles["the controlplane's Google key"],
    )
    tokens = json.loads(
        demo.dev.kubectl("-n", "levers9", "get", "secrets", "-o", "json")
    )  # the Job's token Secrets, data base64-encoded as the API returns it
    assert hits(corpus_of_json(json.dumps(tokens)), needles["worker tokens"])
    assert hits(corpus_of_json(json.dumps(tokens)), needles["workers' serving keys"])
    # A worker's Secret holds the digest of the token that commands it, never that token.
    secret = (demo.state / "worker-token-secret").read_text().strip()
    digests = [command_digest(token) for token in needles["command tokens"]]
    assert hits(corpus_of_json(json.dumps(tokens)), digests)
    assert not hits(corpus_of_json(json.dumps(tokens)), needles["command tokens"])
    assert secret not in json.dumps(tokens)
    # A history's base64 payloads are searched decoded: a planted token is found.
    payload = json.dumps({"token": needles["worker tokens"][0]}).encode()
    planted = json.dumps({"data": base64.b64encode(payload).decode()})
    assert hits(corpus_of_json(planted), needles["worker tokens"])


def test_no_secret_in_any_history(demo: Demo) -> None:
    assert {w["type"] for w in demo.workflows} >= {
        "AttachClusterWorkflow",
        "EgressAllowlistWorkflow",
        "ReconcilePoolWorkflow",
        "MachineWorkflow",
        "WorkerWorkflow",
        "TaskWorkflow",
        "PoolWorkflow",
    }
    found = {
        f"{workflow_id} {what}": hits(corpus_of_json(history), needles)
        for (workflow_id, _), history in demo.histories.items()
        for what, needles in demo.needles().items()
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_no_secret_in_any_log(demo: Demo) -> None:
    logs = {str(p): p.read_text(errors="replace") for p in (demo.state / "logs").glob("*.log")}
    assert {"worker.log", "sandbox.log", "temporal.log"} <= {Path(p).name for p in logs}
    logs["levers9 dev demo"] = demo.output
    pods = demo.dev.kubectl("-n", "levers9", "get", "pods", "-o", "name").split()
    assert pods
    for pod in pods:
        logs[pod] = demo.dev.kubectl("-n", "levers9", "logs", pod, "--all-containers")
    found = {
        f"{name} {what}": hits(text, needles)
        for name, text in logs.items()
        for what, needles in demo.needles().items()
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_no_token_in_the_environment_of_any_agent(demo: Demo) -> None:
    """Every `levers9-worker` process's environ, read from /proc, against the tokens its
    Secrets hold (and the ones that command workers)."""
    needles = demo.needles()
    tokens = needles["worker tokens"] + needles["command tokens"] + needles["the token secret"]
    agents = [
        pid for pid in os.listdir("/proc") if pid.isdigit() and _comm(pid) == "levers9-worker"
    ]
    assert agents, "no levers9-worker process to read"
    found = {}
    for pid in agents:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended meanwhile
        found[pid] = hits(environ.replace("\0", "\n"), tokens)
    assert found, "every agent ended before it was read"
    assert {pid: h for pid, h in found.items() if h} == {}


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def test_every_history_replays_with_the_current_code(demo: Demo) -> None:
    # The controlplane's workflows, and attach's (run by the `levers9 gke attach` process).
    replayer = Replayer(
        workflows=[*WORKFLOWS, AttachClusterWorkflow], data_converter=pydantic_data_converter
    )
    histories = [
        WorkflowHistory.from_json(workflow_id, history)
        for (workflow_id, _), history in demo.histories.items()
    ]

    async def each() -> AsyncIterator[WorkflowHistory]:
        for history in histories:
            yield history

    results = await replayer.replay_workflows(each(), raise_on_replay_failure=False)
    failures = {
        workflow_id: str(failure) for workflow_id, failure in results.replay_failures.items()
    }
    assert failures == {}
    assert len(histories) >= 7
