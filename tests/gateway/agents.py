"""`Agent`: one worker's side of the gateway calls (its ids, its token, the requests it sends)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from levers9.models import worker_workflow_id
from levers9.proto import gateway_pb2, worker_pb2
from levers9.tokens import worker_token

POOL_NAME = "gke-rtx6000"
NODE_IP_ADDRESS = "203.0.113.7:50051"

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Agent:
    pool_name: str
    worker_id: str
    token: str

    @classmethod
    def new(cls, secret: SecretStr, pool_name: str = POOL_NAME) -> Agent:
        worker_id = uuid.uuid4().hex[:12]
        return cls(pool_name, worker_id, worker_token(secret.get_secret_value(), worker_id))

    @property
    def workflow_id(self) -> str:
        return worker_workflow_id(self.pool_name, self.worker_id)

    def metadata(self, token: str | None = None) -> Metadata:
        return (("authorization", f"Bearer {self.token if token is None else token}"),)

    def register(self, **fields: Any) -> gateway_pb2.RegisterRequest:
        values: dict[str, Any] = {
            "pool_name": self.pool_name,
            "worker_id": self.worker_id,
            "node_name": "gke-rtx6000-pool-4f2a-node-1",
            "pod_uid": "6b1f0a52-3c1e-4d8e-9a51-2f0c8e7d1a10",
            "advertised_address": NODE_IP_ADDRESS,
            "gpus": 2,
            "visible_devices": [0, 1],
            "gpu_product": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "agent_version": "0.1.0",
        }
        return gateway_pb2.RegisterRequest(**(values | fields))

    def heartbeat(self, **fields: Any) -> gateway_pb2.HeartbeatRequest:
        values: dict[str, Any] = {
            "pool_name": self.pool_name,
            "worker_id": self.worker_id,
            "running_tasks": 0,
            "idle_since_unix_ms": 1_789_000_000_000,
        }
        return gateway_pb2.HeartbeatRequest(**(values | fields))

    def report(self, task_id: str, **status: Any) -> gateway_pb2.ReportTaskRequest:
        values: dict[str, Any] = {
            "task_id": task_id,
            "state": worker_pb2.TASK_STATE_SUCCEEDED,
            "exit_code": 0,
            "result_json": '{"cuda": true, "matmul_ok": true}',
            "phases": [
                worker_pb2.Phase(name="container.start", at_unix_ms=1_789_000_001_000),
                worker_pb2.Phase(name="worker.gpu_assignment", at_unix_ms=1_789_000_001_500),
            ],
            "log_tail": "matmul ok\n",
            "host": "runc",
        }
        return gateway_pb2.ReportTaskRequest(
            pool_name=self.pool_name,
            worker_id=self.worker_id,
            status=worker_pb2.TaskStatus(**(values | status)),
        )
