"""Histories recorded from end-to-end dev stack runs (tests/reliability/histories/, at least one
per workflow type, as `temporal workflow show -o json` printed them) replay with the current
workflow code. `<Type>.json` are from before issue 17; `<Type>-<path>.json` record its paths: a
task placed by signal, the pool's batched `requests` and `placed` signals (the first 300 events
of a run of `benchmarks/placement.py --sandbox`), a machine told new settings and its worker
passing them on, a worker that tells the pool its cards on change only; and from
tests/reliability/test_dead_worker.py's run: a worker ended by its machine's `job_finished`
(its agent killed), a worker whose deleted Job its liveness window found, and the machine that
told one and started the next. A change to a workflow that running workflows of the old code
could not follow (another activity, another order, a timer removed) fails here: guard it with
`workflow.patched(...)` (docs/operations.md), then record the histories again.

Re-record after a deliberate, patched change: run `levers9 dev demo`, then for each type
`temporal workflow show -w <id> -o json`, saved as {"workflowId": ..., "history": ...}.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, WorkflowReplayResults

from workflows import WORKFLOWS
from workflows.attach import AttachClusterWorkflow
from workflows.cluster import RECORD_MEMO

HISTORIES = Path(__file__).parent / "histories"
ALL_WORKFLOWS = [*WORKFLOWS, AttachClusterWorkflow]


def _recorded() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(HISTORIES.glob("*.json"))}


async def _replay(histories: list[WorkflowHistory]) -> WorkflowReplayResults:
    async def each() -> AsyncIterator[WorkflowHistory]:
        for history in histories:
            yield history

    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
    return await replayer.replay_workflows(each(), raise_on_replay_failure=False)


def test_a_history_for_each_long_lived_workflow() -> None:
    assert set(_recorded()) >= {
        "AttachClusterWorkflow",
        "ClusterWorkflow",
        "EgressAllowlistWorkflow",
        "EndpointWorkflow",
        "MachineWorkflow",
        "PoolWorkflow",
        "ReconcilePoolWorkflow",
        "TaskWorkflow",
        "WorkerWorkflow",
    }


async def test_recorded_histories_replay_with_the_current_code() -> None:
    histories = [
        WorkflowHistory.from_json(doc["workflowId"], doc["history"]) for doc in _recorded().values()
    ]
    results = await _replay(histories)
    assert {k: str(v) for k, v in results.replay_failures.items()} == {}


@pytest.mark.parametrize(
    "workflow_type", ["EndpointWorkflow", "MachineWorkflow", "TaskWorkflow", "WorkerWorkflow"]
)
async def test_a_diverging_history_fails_the_replay(workflow_type: str) -> None:
    """The check can fail: the same history with its first activity or child workflow renamed
    (what code calling another one would meet) is a nondeterminism error."""
    doc = _recorded()[workflow_type]
    events = doc["history"]["events"]
    commands = {
        "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED": (
            "activityTaskScheduledEventAttributes",
            "activityType",
        ),
        "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED": (
            "startChildWorkflowExecutionInitiatedEventAttributes",
            "workflowType",
        ),
    }
    first = next(e for e in events if e["eventType"] in commands)
    attributes, named = commands[first["eventType"]]
    first[attributes][named]["name"] = "a_type_the_code_never_calls"
    results = await _replay([WorkflowHistory.from_json(doc["workflowId"], doc["history"])])
    # Keyed by run id.
    [failure] = results.replay_failures.values()
    assert "Nondeterminism error" in str(failure)
    assert "a_type_the_code_never_calls" in str(failure)


def test_the_cluster_history_is_of_the_code_that_keeps_its_record_in_its_memo() -> None:
    """Recorded with the `cluster-record-memo` patch taken: its replay follows that branch."""
    events = _recorded()["ClusterWorkflow"]["history"]["events"]
    patches = [
        json.loads(base64.b64decode(payload["data"]))["id"]
        for event in events
        if event["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
        for payload in event["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"]
    ]
    assert patches == [RECORD_MEMO]
