"""The search attributes of DESIGN.md: what the Temporal UI and `temporal workflow list --query`
filter the pool's workflows by. Apart from `levers9.models` so that reading a record (the CLI)
does not load the Temporal SDK."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

POOL_NAME = SearchAttributeKey.for_keyword("PoolName")
NODE_NAME = SearchAttributeKey.for_keyword("NodeName")
WORKER_STATE = SearchAttributeKey.for_keyword("WorkerState")
GPU_TYPE = SearchAttributeKey.for_keyword("GpuType")
WORKSPACE = SearchAttributeKey.for_keyword("Levers9Workspace")
"""The workspace a task (and the workspace's own record) belongs to."""
SEARCH_ATTRIBUTES = (POOL_NAME, NODE_NAME, WORKER_STATE, GPU_TYPE, WORKSPACE)
