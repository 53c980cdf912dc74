"""Workflow and activity inputs and results, and the search attributes the Temporal UI filters on.

One `<Thing>Input` / `<Thing>Result` per workflow and activity, so fields can be added later
without breaking running workflows. Inputs carry pool *names*, never credentials.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from temporalio.common import SearchAttributeKey

POOL_NAME = SearchAttributeKey.for_keyword("PoolName")
NODE_NAME = SearchAttributeKey.for_keyword("NodeName")
WORKER_STATE = SearchAttributeKey.for_keyword("WorkerState")
GPU_TYPE = SearchAttributeKey.for_keyword("GpuType")
SEARCH_ATTRIBUTES = (POOL_NAME, NODE_NAME, WORKER_STATE, GPU_TYPE)

RECONCILE_POOL_WORKFLOW = "ReconcilePoolWorkflow"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class ReconcilePoolInput(_Record):
    pool_name: str


class DescribePoolInput(_Record):
    pool_name: str


class PoolSummary(_Record):
    """What the Temporal worker has loaded for a pool: no credentials, only their kind."""

    pool_name: str
    gpu_type: str
    flavor: str
    endpoint: str
    namespace: str
    node_selector: dict[str, str]
    worker_image: str
    tunnel: bool
    host_network: bool


class ReconcilePoolResult(_Record):
    """One reconcile pass; the next pass reads it back as its last completion result."""

    pool_name: str
    pass_number: int
    observed_at: datetime
    pool: PoolSummary


def reconcile_schedule_id(pool_name: str) -> str:
    return f"reconcile:{pool_name}"
