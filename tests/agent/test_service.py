"""WorkerService over real gRPC on 127.0.0.1, with the process runtime.

Covers a task that writes its result JSON (SUCCEEDED, exit code, phases in order, result, log
tail), RunTask's idempotency by task id, StreamLogs (follow to the end, resume from an offset),
CancelTask killing the task's whole process group, a task asking for a card the worker does not
have (FAILED with the spec's `not enough GPUs available` wording), the task's environment (its
cards, the driver on PATH, the result path, and no worker token), Exec with stdin, stdout,
stderr and exit code, the token check (UNAUTHENTICATED without it, health stays open), and the
ports guard (a port another running task of the worker published fails the second task with
`port N is already published by task T on this worker`; it is free again once that task ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from levers9.agent.driver import DriverSetup
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.server import WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.supervisor import TaskManager
from levers9.contract import COMMAND_TOKEN_HEADER
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.rpc import bearer
from levers9.tokens import command_digest, command_metadata, command_token, worker_token
from tests.agent.conftest import ServedWorker
from tests.agent.kit import AUTH
from tests.waiting import eventually

PY = sys.executable
TERMINAL = {
    worker_pb2.TASK_STATE_SUCCEEDED,
    worker_pb2.TASK_STATE_FAILED,
    worker_pb2.TASK_STATE_CANCELLED,
    worker_pb2.TASK_STATE_LOST,
}


def python_task(task_id: str, code: str, gpus: Sequence[int] = ()) -> worker_pb2.RunTaskRequest:
    return worker_pb2.RunTaskRequest(
        task=worker_pb2.TaskSpec(
            task_id=task_id, image="python:3", command=[PY, "-c", code], gpu_indices=gpus
        )
    )


async def run_to_end(
    served: ServedWorker, request: worker_pb2.RunTaskRequest
) -> worker_pb2.TaskStatus:
    await served.stub.RunTask(request, metadata=AUTH)
    return await finished(served, request.task.task_id)


async def finished(served: ServedWorker, task_id: str) -> worker_pb2.TaskStatus:
    statuses: list[worker_pb2.TaskStatus] = []

    async def ended() -> bool:
        statuses.append(
            await served.stub.GetTask(worker_pb2.GetTaskRequest(task_id=task_id), metadata=AUTH)
        )
        return statuses[-1].state in TERMINAL

    await eventually(ended, within=10)
    return statuses[-1]


async def started(served: ServedWorker, task_id: str, marker: bytes) -> None:
    """Waits until the task has printed `marker` (it is up and running its code)."""

    async def printed() -> bool:
        return marker in served.tasks.output(task_id).read(0)

    await eventually(printed, within=10)


RESULT_TASK = """
import json, os
print("checking the GPU", flush=True)
with open(os.environ["LEVERS9_RESULT_PATH"], "w") as f:
    json.dump({"host": "process", "cuda": False}, f)
"""


async def test_a_task_runs_and_keeps_its_result(served: ServedWorker) -> None:
    status = await run_to_end(served, python_task("t-result", RESULT_TASK, gpus=[0]))

    assert status.state == worker_pb2.TASK_STATE_SUCCEEDED
    assert status.exit_code == 0
    assert json.loads(status.result_json) == {"host": "process", "cuda": False}
    assert status.log_tail == "checking the GPU\n"
    assert status.host == "process"
    assert [p.name for p in status.phases] == [
        "worker.gpu_assignment",
        "container.start",
        "container.exit",
    ]
    assert all(not p.error for p in status.phases)
    times = [p.at_unix_ms for p in status.phases]
    assert times == sorted(times)
    assert times[0] > 0
    # Its start, then its end: the record hears both from the worker.
    assert [(r.task_id, r.state) for r in served.reports] == [
        ("t-result", worker_pb2.TASK_STATE_RUNNING),
        ("t-result", worker_pb2.TASK_STATE_SUCCEEDED),
    ], "the reporter is called in order (delivery is the gateway client's)"


async def test_a_failing_task_keeps_its_exit_code(served: ServedWorker) -> None:
    status = await run_to_end(served, python_task("t-exit", "import sys; sys.exit(7)"))

    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert status.exit_code == 7
    assert status.reason == "exited with code 7"


async def test_run_task_is_idempotent_by_task_id(served: ServedWorker) -> None:
    request = python_task("t-once", "print('ran', flush=True)")
    first = await served.stub.RunTask(request, metadata=AUTH)
    second = await served.stub.RunTask(request, metadata=AUTH)
    status = await finished(served, "t-once")

    assert (first.already_running, second.already_running) == (False, True)
    assert status.log_tail == "ran\n"


async def test_stream_logs_follows_until_exit_and_resumes_at_an_offset(
    served: ServedWorker,
) -> None:
    code = (
        "import time\nfor i in range(5):\n    print(f'line {i}', flush=True)\n    time.sleep(0.05)"
    )
    await served.stub.RunTask(python_task("t-logs", code), metadata=AUTH)

    chunks = [
        chunk
        async for chunk in served.stub.StreamLogs(
            worker_pb2.StreamLogsRequest(task_id="t-logs", follow=True), metadata=AUTH
        )
    ]
    data = b"".join(c.data for c in chunks)
    assert data == b"".join(f"line {i}\n".encode() for i in range(5))
    assert [c.offset for c in chunks] == [
        sum(len(c.data) for c in chunks[:i]) for i in range(len(chunks))
    ]

    later = served.stub.StreamLogs(
        worker_pb2.StreamLogsRequest(task_id="t-logs", offset=7), metadata=AUTH
    )
    assert b"".join([c.data async for c in later]) == data[7:]


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


CHILD_TASK = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(f"child {child.pid}", flush=True)
time.sleep(60)
"""


async def test_cancel_kills_the_task_and_its_process_group(served: ServedWorker) -> None:
    await served.stub.RunTask(python_task("t-cancel", CHILD_TASK), metadata=AUTH)
    await started(served, "t-cancel", b"child ")
    child = int(served.tasks.output("t-cancel").read(0).split()[1])

    response = await served.stub.CancelTask(
        worker_pb2.CancelTaskRequest(task_id="t-cancel"), metadata=AUTH
    )
    status = await finished(served, "t-cancel")

    assert response.cancelled
    assert status.state == worker_pb2.TASK_STATE_CANCELLED
    assert status.exit_code == 128 + 15  # SIGTERM

    async def child_gone() -> bool:  # signals land asynchronously
        return not alive(child)

    await eventually(child_gone, within=5)
    again = await served.stub.CancelTask(
        worker_pb2.CancelTaskRequest(task_id="t-cancel"), metadata=AUTH
    )
    assert not again.cancelled


async def test_a_card_the_worker_does_not_have_fails_the_task(served: ServedWorker) -> None:
    status = await run_to_end(served, python_task("t-card", "print('never')", gpus=[2]))

    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert status.reason == "not enough GPUs available: requested=1 visible=2"
    [phase] = status.phases
    assert phase.name == "worker.gpu_assignment"
    assert "[2]" in phase.error
    assert served.reports[-1].reason == status.reason


async def test_a_card_in_use_is_not_handed_out_twice(served: ServedWorker) -> None:
    await served.stub.RunTask(
        python_task("t-holds", "import time; print('up', flush=True); time.sleep(60)", [1]),
        metadata=AUTH,
    )
    await started(served, "t-holds", b"up")
    status = await run_to_end(served, python_task("t-wants", "print('never')", gpus=[0, 1]))

    assert status.reason == "not enough GPUs available: requested=2 visible=1"


ENV_TASK = """
import json, os
json.dump(dict(os.environ), open(os.environ["LEVERS9_RESULT_PATH"], "w"))
"""


@pytest.mark.parametrize(("cards", "visible"), [([1], "1"), ([0, 1], "0,1"), ([], "void")])
async def test_the_task_sees_only_its_cards(
    served: ServedWorker, cards: list[int], visible: str
) -> None:
    request = python_task(f"t-env-{visible}", ENV_TASK, gpus=cards)
    request.task.env["MODEL"] = "qwen"
    status = await run_to_end(served, request)
    env = json.loads(status.result_json)

    assert env["NVIDIA_VISIBLE_DEVICES"] == visible
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, cards))
    assert env["MODEL"] == "qwen"
    assert env["PATH"].split(":")[0] == str(served.driver.bin_dirs[0])
    assert env["LEVERS9_RESULT_PATH"].endswith("result.json")
    assert "LEVERS9_WORKER_TOKEN" not in env


EXEC_COMMAND = """
import os, sys
print(sys.stdin.read().upper(), end="")
print(os.environ["NVIDIA_VISIBLE_DEVICES"], file=sys.stderr)
sys.exit(3)
"""


async def _exec_requests(
    task_id: str, stdin: Sequence[bytes] = (), *, hold: bool = False
) -> AsyncIterator[worker_pb2.ExecRequest]:
    """ExecStart, then `stdin`; then half-closes, or with `hold` keeps the stream open as an
    interactive caller does (and so never writes after the worker has ended the call: the
    asyncio client would report INTERNAL then, grpc/grpc#36066)."""
    start = worker_pb2.ExecStart(task_id=task_id, command=[PY, "-c", EXEC_COMMAND])
    yield worker_pb2.ExecRequest(start=start)
    for chunk in stdin:
        yield worker_pb2.ExecRequest(stdin=chunk)
    if hold:
        await asyncio.Event().wait()


async def test_exec_runs_in_the_task_context(served: ServedWorker) -> None:
    await served.stub.RunTask(
        python_task("t-exec", "import time; print('up', flush=True); time.sleep(60)", [1]),
        metadata=AUTH,
    )
    await started(served, "t-exec", b"up")

    responses = [
        r
        async for r in served.stub.Exec(
            _exec_requests("t-exec", [b"hello ", b"worker"]), metadata=AUTH
        )
    ]

    stdout = b"".join(r.stdout for r in responses if r.HasField("stdout"))
    stderr = b"".join(r.stderr for r in responses if r.HasField("stderr"))
    assert (stdout, stderr) == (b"HELLO WORKER", b"1\n")
    assert responses[-1].WhichOneof("message") == "exit_code"
    assert responses[-1].exit_code == 3


TERMINAL_COMMAND = """
import os, signal, sys
# os.write, not print: the signal may land while the first print is still in its buffered
# write (its line already out), and print inside it is a reentrant call that raises.
size = lambda *_: os.write(1, f"resized {tuple(os.get_terminal_size(1))}\\n".encode())
signal.signal(signal.SIGWINCH, size)
print(os.isatty(0), os.isatty(1), tuple(os.get_terminal_size(1)), flush=True)
line = sys.stdin.readline()
print("read", line.strip(), flush=True)
sys.exit(6)
"""


async def test_exec_on_a_terminal_follows_its_size(served: ServedWorker) -> None:
    await served.stub.RunTask(
        python_task("t-tty", "import time; print('up', flush=True); time.sleep(60)", []),
        metadata=AUTH,
    )
    await started(served, "t-tty", b"up")
    listening, resized = asyncio.Event(), asyncio.Event()

    async def requests() -> AsyncIterator[worker_pb2.ExecRequest]:
        start = worker_pb2.ExecStart(
            task_id="t-tty", command=[PY, "-c", TERMINAL_COMMAND], tty=True
        )
        start.size.rows, start.size.cols = 30, 100
        yield worker_pb2.ExecRequest(start=start)
        await listening.wait()  # its first line: the SIGWINCH handler is in place
        yield worker_pb2.ExecRequest(resize=worker_pb2.TerminalSize(rows=50, cols=132))
        await resized.wait()
        yield worker_pb2.ExecRequest(stdin=b"typed\n")
        await asyncio.Event().wait()  # an interactive caller keeps its side open

    out = b""
    code = None
    async for response in served.stub.Exec(requests(), metadata=AUTH):
        assert response.WhichOneof("message") in ("stdout", "exit_code"), "one stream: the tty"
        out += response.stdout
        if b"\n" in out:
            listening.set()
        if b"resized" in out:
            resized.set()
        if response.HasField("exit_code"):
            code = response.exit_code
    lines = out.decode().splitlines()
    assert lines[0] == "True True (100, 30)"
    assert "resized (132, 50)" in lines
    assert lines[-1] == "read typed"
    assert "typed" in lines, "the terminal echoes what was typed"
    assert code == 6


async def test_exec_in_an_unknown_task_is_not_found(served: ServedWorker) -> None:
    call = served.stub.Exec(_exec_requests("t-nobody", hold=True), metadata=AUTH)
    with pytest.raises(aio.AioRpcError) as raised:
        _ = [r async for r in call]
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    "metadata", [(), bearer.metadata("l9w1.someone-else"), (("authorization", "token"),)]
)
async def test_calls_without_the_worker_token_are_unauthenticated(
    served: ServedWorker, metadata: tuple[tuple[str, str], ...], tmp_path: Path
) -> None:
    stub = served.stub
    ran = tmp_path / "ran"
    run = python_task("t-untrusted", f"open({str(ran)!r}, 'a').write('ran')")
    with pytest.raises(aio.AioRpcError) as refused:
        await stub.RunTask(run, metadata=metadata)
    with pytest.raises(aio.AioRpcError) as unknown:
        await stub.GetTask(worker_pb2.GetTaskRequest(task_id="t-untrusted"), metadata=AUTH)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND, "the refused task was never kept"
    with pytest.raises(aio.AioRpcError) as unary:
        await stub.GetTask(worker_pb2.GetTaskRequest(task_id="t"), metadata=metadata)
    with pytest.raises(aio.AioRpcError) as stream:
        _ = [
            c
            async for c in stub.StreamLogs(
                worker_pb2.StreamLogsRequest(task_id="t"), metadata=metadata
            )
        ]
    # The bidi call without a request iterator: the worker may end it before the client is
    # done with one, and the asyncio client then reports INTERNAL for the iterator's close
    # (seen on a loaded CI machine; grpc/grpc#36066), not the status the worker sent.
    bidi = stub.Exec(metadata=metadata)
    start = worker_pb2.ExecStart(task_id="t", command=[PY, "-c", EXEC_COMMAND])
    with contextlib.suppress(aio.AioRpcError, aio.UsageError):  # already ended by the worker
        await bidi.write(worker_pb2.ExecRequest(start=start))
    codes = [e.value.code() for e in (refused, unary, stream)] + [await bidi.code()]
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 4
    assert (served.tasks.running, served.reports, ran.exists()) == (0, [], False)
    # The same request with the token runs: only the token kept it from running.
    await run_to_end(served, run)
    assert ran.read_text() == "ran"


async def test_health_needs_no_token(served: ServedWorker) -> None:
    health = health_pb2_grpc.HealthStub(served.channel)
    for service in ("", "levers9.v1.WorkerService"):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_worker_given_a_command_digest_takes_only_the_controlplane_s_token(
    tmp_path: Path,
) -> None:
    """One credential per direction: the worker's own token (what it presents to the gateway,
    in its Secret) does not command it; only the controlplane's command token, of which the
    worker holds just the SHA-256, does."""
    secret, worker_id = "s" * 40, "w-command"
    own = worker_token(secret, worker_id)
    digest = command_digest(command_token(secret, worker_id))
    driver = DriverSetup((), (tmp_path / "driver/bin",), ())
    tasks = TaskManager(ProcessRuntime(driver, {}), (0,), tmp_path / "work", lambda _: None)
    server = await WorkerServer.start(WorkerService(tasks), own, "127.0.0.1", command_digest=digest)
    try:
        async with aio.insecure_channel(server.advertised_address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            request = worker_pb2.GetTaskRequest(task_id="t-none")
            for metadata in (
                bearer.metadata(own),  # the worker's own token
                ((COMMAND_TOKEN_HEADER, command_token(secret, "w-other")),),
                ((COMMAND_TOKEN_HEADER, own),),
            ):
                with pytest.raises(aio.AioRpcError) as refused:
                    await stub.GetTask(request, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(aio.AioRpcError) as answered:
                await stub.GetTask(request, metadata=command_metadata(secret, worker_id))
            assert answered.value.code() == grpc.StatusCode.NOT_FOUND  # past the check
    finally:
        await tasks.shutdown(grace_s=1)
        await server.stop(0)
    assert command_token(secret, worker_id) != own


async def test_a_port_published_by_a_running_task_is_refused_to_a_second_one(
    served: ServedWorker,
) -> None:
    holds = python_task("t-port-holds", "import time; print('up', flush=True); time.sleep(60)")
    holds.task.ports.extend([8090, 8091])
    await served.stub.RunTask(holds, metadata=AUTH)
    await started(served, "t-port-holds", b"up")
    wants = python_task("t-port-wants", "print('never', flush=True)")
    wants.task.ports.extend([8085, 8091])

    status = await run_to_end(served, wants)

    assert status.state == worker_pb2.TASK_STATE_FAILED
    assert status.reason == "port 8091 is already published by task t-port-holds on this worker"
    assert [(p.name, p.error) for p in status.phases] == [
        ("worker.gpu_assignment", ""),
        ("worker.ports", "ports [8091] are in use by task t-port-holds"),
    ]
    assert b"never" not in served.tasks.output("t-port-wants").read(0)
    # The guard holds only while the holder runs: once it ends, the port is free again.
    await served.stub.CancelTask(
        worker_pb2.CancelTaskRequest(task_id="t-port-holds"), metadata=AUTH
    )
    await finished(served, "t-port-holds")
    after = python_task("t-port-after", "print('ran', flush=True)")
    after.task.ports.append(8091)
    assert (await run_to_end(served, after)).log_tail == "ran\n"
