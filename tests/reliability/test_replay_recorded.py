"""Histories recorded with the current workflow code (tests/reliability/histories/, at least one
per workflow type, as `temporal workflow show -o json` printed them) replay with it. They come
from one run of `python -m tests.reliability.record_histories` (a `levers9 dev demo` stack, then
a burst of tasks, an endpoint through a cold start, a joined cluster, new settings told through
a machine to its worker, a worker's agent killed, a worker's Job deleted): `<Type>.json` the
plain run of each type, `<Type>-<path>.json` a path worth pinning (`-settings`, `-job-finished`,
`-liveness-job-deleted`). A change to a workflow that running workflows of the old code could
not follow (another activity, another order, a timer removed) fails here: guard it with
`workflow.patched(...)` (docs/operations.md), then record the histories again.
`DiskWorkflow.json` and `PoolWorkflow-disk.json` (a disk's tasks pinned to its node, the pool
telling the disk's record a task of it ended) come from tests/integration/test_disk_pin.py's
flow on the dev server, as `WorkflowHistory.to_json_dict()` gives them. `WorkerWorkflow-cache.json`
(with the pool's `cache.enabled`, a heartbeat saying what the node's image cache holds, announced
to the pool: the patched marker `cache-report-announced`) comes from
tests/integration/test_cache_locality_sandbox.py's flow on the sandbox, the same way.
`BoxWorkflow.json` (a box of team-a: its task started, a use, stop, start, a stale task end,
delete) from tests/integration/test_box_workflow.py's stand-in task on the dev server.
"""

from __future__ import annotations

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
