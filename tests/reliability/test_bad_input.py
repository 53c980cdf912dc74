"""Bad input from outside never crashes anything and is always answered clearly.

- Values files (hypothesis): a pool block mutated at random (keys dropped, values of any type,
  unknown keys) or a file of random bytes loads or fails with `ConfigError`, every line naming
  a field under `config.` (or the spec's `invalid provider name`), and never echoing the key.
- The gateway and a worker's WorkerService (hypothesis, real servers on loopback, raw bytes on
  a real gRPC channel): garbage, truncated, huge and unauthenticated requests to every method
  get a status that says what is wrong (never UNKNOWN or INTERNAL, always a message), and the
  server still answers its health check after each.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import event, given
from hypothesis import strategies as st
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.agent.driver import DriverSetup
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.server import WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.supervisor import TaskManager
from levers9.config import INVALID_PROVIDER, ConfigError, Values, load, parse_values
from levers9.devstack import values as devvalues
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.gateway.tunnel import TunnelHub
from levers9.proto import gateway_pb2, worker_pb2
from levers9.records.workers import TemporalWorkerRecords
from levers9.tokens import operator_token, worker_token
from sandbox.pki import mint_certificate_authority, mint_service_account_key
from sandbox.threaded import LoopThread
from tests.properties import examples

CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = json.dumps(
    mint_service_account_key(project="demo", account="levers9-controlplane", token_uri="https://x")
)
KEY_NEEDLE = json.loads(KEY)["private_key"].splitlines()[1][:32]
POOLS = "config.worker.pools"
SECRET = "bad-input-secret-0123456789"
WORKER_TOKEN = "l9w1.bad-input-worker-token"
CLEAR = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a stream that waits for more (Tunnel, Exec)
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
}
EXAMPLES = examples(60, deadline=None)

# --- values ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(block: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(block, dict):
        for key, value in block.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))


VALID = devvalues.pool_block(CA, "https://34.1.2.3")
VALID["kubernetes"]["credentials"] = KEY
PATHS = sorted(_paths(VALID))


@st.composite
def mutated_blocks(draw: st.DrawFn) -> dict[str, Any]:
    block: dict[str, Any] = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = block
        for key in path[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                break
            parent = parent[key]
        else:
            if not isinstance(parent, dict):
                continue
            action = draw(st.sampled_from(["drop", "replace", "unknown"]))
            if action == "drop":
                parent.pop(path[-1], None)
            elif action == "replace":
                parent[path[-1]] = draw(json_values)
            else:
                parent[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    return block


def _named(line: str) -> bool:
    """The line names its field (`config.worker.pools.x.kubernetes.flavor: ...`, `config: ...`),
    or is the spec's own `invalid provider name`."""
    return line == INVALID_PROVIDER or line.startswith(("config.", "config:"))


@EXAMPLES
@given(block=mutated_blocks(), name=st.sampled_from(["gke-rtx6000", "Bad_Name", "x" * 50]))
def test_a_mutated_pool_block_fails_naming_the_field(block: dict[str, Any], name: str) -> None:
    values = parse_values({"config": {"worker": {"pools": {name: block}}}})
    for problem in values.problems:
        assert problem.pool_name == name
        assert _named(problem.error), problem.error
        assert KEY_NEEDLE not in problem.error
    assert len(values.pools) + len({p.pool_name for p in values.problems}) == 1


def _refusal(load_them: Callable[[], Values]) -> tuple[Values | None, list[str]]:
    """What loading gave: the values, or the ConfigError's lines (any other exception fails)."""
    try:
        return load_them(), []
    except ConfigError as error:
        return None, error.errors


@EXAMPLES
@given(doc=json_values, where=st.sampled_from(["config", "controlplane", "worker", "pools"]))
def test_any_document_loads_or_names_the_field(doc: Any, where: str) -> None:
    nested = {
        "config": doc,
        "controlplane": {"controlplane": doc},
        "worker": {"worker": doc},
        "pools": {"worker": {"pools": doc}},
    }[where]
    values, errors = _refusal(lambda: parse_values({"config": nested}))
    if values is None:
        assert errors
        assert all(_named(line) for line in errors), errors
    else:
        assert all(_named(p.error) for p in values.problems)


@EXAMPLES
@given(content=st.binary(max_size=300))
def test_a_values_file_of_random_bytes(
    content: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("values") / "values.yaml"
    path.write_bytes(content)
    _, errors = _refusal(lambda: load([path]))
    assert all(line.startswith(f"{path}:") or _named(line) for line in errors), errors


def test_config_check_names_the_file_and_never_tracebacks(tmp_path: Path) -> None:
    cases = {
        "binary.yaml": b"\x00\xff\xfe not yaml \x00",
        "list.yaml": b"- a\n- b\n",
        "tabs.yaml": b"config:\n\t worker: 1\n",
        "pool.yaml": json.dumps(
            {"config": {"worker": {"pools": {"gke-rtx6000": {**VALID, "gpuType": 7}}}}}
        ).encode(),
    }
    levers9 = Path(sys.executable).parent / "levers9"
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        done = subprocess.run(
            [str(levers9), "config", "check", "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0, name
        assert "Traceback" not in done.stderr + done.stdout, name
        assert KEY_NEEDLE not in done.stderr + done.stdout, name
        said = done.stderr + done.stdout
        assert str(path) in said or "config.worker.pools.gke-rtx6000.gpuType" in said, said


# --- the gateway and the agent ------------------------------------------------------------


class Served:
    def __init__(self, loop: LoopThread, port: int, methods: dict[str, str]) -> None:
        self.loop = loop
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.methods = methods  # full method name -> its kind

    def call(self, method: str, body: bytes, metadata: list[tuple[str, str]]) -> grpc.Call | None:
        """Sends `body` as is (no serializer) to `method`; the failed call, or None."""
        kind = self.methods[method]
        md = tuple((key, value) for key, value in metadata)
        try:
            if kind == "unary_unary":
                unary = self.channel.unary_unary(method)  # type: ignore[var-annotated]
                unary(body, metadata=md, timeout=5)
            elif kind == "unary_stream":
                stream = self.channel.unary_stream(method)  # type: ignore[var-annotated]
                list(stream(body, metadata=md, timeout=2))
            else:
                both = self.channel.stream_stream(method)  # type: ignore[var-annotated]
                list(both(iter([body]), metadata=md, timeout=2))
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call):
                raise
            return error
        return None

    def healthy(self) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _methods(*services: Any) -> dict[str, str]:
    kinds = {}
    for service in services:
        for method in service.methods:
            kind = (
                ("stream" if method.client_streaming else "unary")
                + "_"
                + ("stream" if method.server_streaming else "unary")
            )
            kinds[f"/{service.full_name}/{method.name}"] = kind
    return kinds


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    thread.start()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def gateway(dev_env: WorkflowEnvironment, loop: LoopThread) -> Iterator[Served]:
    address = dev_env.client.service_client.config.target_host
    holder: dict[str, Gateway] = {}

    async def start() -> int:
        client = await Client.connect(address)
        gateway = Gateway(
            TemporalWorkerRecords(client),
            SecretStr(SECRET),
            tasks=TemporalTaskRecords(client, "bad-input-queue"),
            tunnels=TunnelHub(SecretStr(SECRET), "bad-input-replica-x"),
            # As worker_main serves it: registrations checked against the pool's transport.
            tunnelled={"gke-rtx6000": False, "gke-tunnel": True},
        )
        holder["gateway"] = gateway
        return await gateway.start("127.0.0.1:0")

    port = loop.run(start())
    services = gateway_pb2.DESCRIPTOR.services_by_name
    yield Served(loop, port, _methods(services["Gateway"], services["Tasks"]))
    loop.run(holder["gateway"].stop(grace=0))


@pytest.fixture(scope="module")
def agent(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("agent")
    holder: dict[str, Any] = {}

    async def start() -> WorkerServer:
        driver = DriverSetup((), (root / "driver/bin",), ())
        tasks = TaskManager(
            ProcessRuntime(driver, {"PATH": "/usr/bin:/bin"}), (0, 1), root / "work", lambda _: None
        )
        holder["tasks"] = tasks
        return await WorkerServer.start(WorkerService(tasks), WORKER_TOKEN, "127.0.0.1")

    server = loop.run(start())
    port = int(server.advertised_address.rsplit(":", 1)[1])
    yield Served(loop, port, _methods(worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]))
    loop.run(holder["tasks"].shutdown(grace_s=1))
    loop.run(server.stop(0))


def _gateway_metadata() -> st.SearchStrategy[list[tuple[str, str]]]:
    return st.sampled_from(
        [
            [],
            [("authorization", "Bearer not-a-token")],
            [("authorization", "Basic dXNlcjpwYXNz")],
            [("authorization", f"Bearer {worker_token(SECRET, 'w-1')}")],
            [("authorization", f"Bearer {operator_token(SECRET)}")],
            [("authorization", f"Bearer {worker_token('another-secret', 'w-1')}")],
        ]
    )


def _assert_clear(error: grpc.Call | None, method: str) -> None:
    if error is None:
        return  # some random bytes are a valid message, and some calls then succeed
    code = error.code()
    details = error.details()
    assert code in CLEAR, f"{method}: {code} {details}"
    assert details, f"{method}: {code} without a message"
    assert SECRET not in details


@EXAMPLES
@given(body=st.binary(max_size=2048), metadata=_gateway_metadata(), data=st.data())
def test_the_gateway_answers_garbage_clearly(
    gateway: Served, body: bytes, metadata: list[tuple[str, str]], data: st.DataObject
) -> None:
    method = data.draw(st.sampled_from(sorted(gateway.methods)))
    _assert_clear(gateway.call(method, body, metadata), method)
    assert gateway.healthy()


@st.composite
def worker_messages(draw: st.DrawFn, cls: type[Message]) -> bytes:
    """A well-formed message of `cls` from worker `w-1` (whose token the call may carry), every
    other scalar field drawn at random: the calls that get past parsing and authentication."""
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if field.name == "worker_id":
            message.worker_id = "w-1"  # type: ignore[attr-defined]
            continue
        if field.is_repeated or field.message_type is not None:
            continue
        value = draw(_SCALARS.get(field.type, st.nothing()))
        if field.enum_type is not None:
            value = draw(st.sampled_from([v.number for v in field.enum_type.values]))
        setattr(message, field.name, value)
    return message.SerializeToString()


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: st.text(max_size=40),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=40),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=False),
    FieldDescriptor.TYPE_FLOAT: st.floats(allow_nan=False, width=32),
    FieldDescriptor.TYPE_ENUM: st.just(0),
}
WORKER_CALLS = {
    "/levers9.v1.Gateway/Register": gateway_pb2.RegisterRequest,
    "/levers9.v1.Gateway/Heartbeat": gateway_pb2.HeartbeatRequest,
    "/levers9.v1.Gateway/ReportTask": gateway_pb2.ReportTaskRequest,
}


@EXAMPLES
@given(data=st.data())
def test_the_gateway_answers_wellformed_nonsense_from_a_worker_clearly(
    gateway: Served, data: st.DataObject
) -> None:
    method = data.draw(st.sampled_from(sorted(WORKER_CALLS)))
    body = data.draw(worker_messages(WORKER_CALLS[method]))
    token = [("authorization", f"Bearer {worker_token(SECRET, 'w-1')}")]
    error = gateway.call(method, body, token)
    event(f"{method} {'OK' if error is None else error.code()}")
    _assert_clear(error, method)
    assert gateway.healthy()


@EXAMPLES
@given(data=st.data())
def test_list_tasks_answers_wellformed_nonsense_from_the_operator_clearly(
    gateway: Served, data: st.DataObject
) -> None:
    """ListTasks past parsing and the operator token: any pool name, page size and page token
    is a page or a refusal naming the field (never a query Temporal fails on)."""
    method = "/levers9.v1.Tasks/ListTasks"
    body = data.draw(worker_messages(gateway_pb2.ListTasksRequest))
    error = gateway.call(method, body, [("authorization", f"Bearer {operator_token(SECRET)}")])
    event(f"ListTasks {'OK' if error is None else error.code()}")
    _assert_clear(error, method)
    if error is not None:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert (error.details() or "").split(":")[0] in ("pool_name", "page_size", "page_token")
    assert gateway.healthy()


@EXAMPLES
@given(
    body=st.binary(max_size=2048),
    metadata=st.sampled_from(
        [[], [("authorization", "Bearer wrong")], [("authorization", f"Bearer {WORKER_TOKEN}")]]
    ),
    data=st.data(),
)
def test_the_agent_answers_garbage_clearly(
    agent: Served, body: bytes, metadata: list[tuple[str, str]], data: st.DataObject
) -> None:
    method = data.draw(st.sampled_from(sorted(agent.methods)))
    error = agent.call(method, body, metadata)
    if not metadata or metadata[0][1] != f"Bearer {WORKER_TOKEN}":
        assert error is not None
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
    _assert_clear(error, method)
    assert agent.healthy()


@pytest.mark.parametrize("who", ["gateway", "agent"])
def test_a_huge_message_is_refused_and_the_server_stays_up(
    who: str, request: pytest.FixtureRequest
) -> None:
    served: Served = request.getfixturevalue(who)
    for method, kind in served.methods.items():
        if kind != "unary_unary":
            continue
        token = worker_token(SECRET, "w-1") if who == "gateway" else WORKER_TOKEN
        error = served.call(
            method, b"\x0a" + b"x" * (5 << 20), [("authorization", f"Bearer {token}")]
        )
        assert error is not None
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, error)
        assert served.healthy()


def test_a_message_that_does_not_parse_is_invalid_argument(gateway: Served) -> None:
    error = gateway.call("/levers9.v1.Gateway/Register", b"\xff\xff\xff", [])
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "/levers9.v1.Gateway/Register: the request is not a valid message" in error.details()
