"""Tasks end to end on the sandbox, driven by the real CLI as a user drives it: the GPU check
(`levers9 pool check`, and `deploy/gke/check-gke-pool.sh` around it) prints COMPLETE with what
the container saw (no GPU here: `cuda` false, `nvidia_smi` null, never an invented device) on a
pool whose values say `simulatedGpus: true`, and FAILED (exit 1) with the reason on one that
does not;
`levers9 run` prints the task's output and result, a task sees only its cards; `run --wait 0`
prints DEADLINE_EXCEEDED and the task still completes; a worker shut down mid-task fails the
task with the reason, never silently. Without the tunnel, the controlplane reaches every worker
over TLS that it checks against its own worker CA. Every task runs in a container: those that
name no image in the worker's own image (the pool sets no taskDefaults.image), pulled from a
registry standing in for the project's (`reconciling(containers=True)`).

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from temporalio.testing import WorkflowEnvironment

from levers9.models import TERMINAL
from levers9.records.listing import list_worker_records
from levers9.records.tasks import task_record
from levers9.rpc.worker_tls import server_name, worker_ca, worker_channel
from levers9.temporal import connect, sync_reconcile_schedules
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
WITHIN = 60


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("tasks")
    async with reconciling(dev_env.client, directory, containers=True) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def test_workers_serve_tls_with_the_certificate_the_controlplane_issued(
    cp: Controlplane,
) -> None:
    """Every worker's Secret (read with kubectl) carries a certificate for its own name from
    the CA of this controlplane's secret; the worker refuses plaintext, answers TLS checked as
    the controlplane checks it, and fails the handshake for any other worker's name."""
    secret = cp.settings.token_secret()
    assert secret is not None
    ca = worker_ca(secret.get_secret_value())
    records = await list_worker_records(cp.settings, POOL, include_ended=False)
    assert len(records) == 3
    listed = await cp.cli("worker", "list", "--pool", POOL, "-o", "json")
    assert [w["tls"] for w in json.loads(listed.stdout)] == [True] * 3
    for record in records:
        assert record.address is not None
        listed = json.loads(
            await cp.kubectl(
                "-n", "levers9", "get", "secret", f"{record.job_name}-token", "-o", "json"
            )
        )
        cert = x509.load_pem_x509_certificate(base64.b64decode(listed["data"]["tls.crt"]))
        cert.verify_directly_issued_by(ca.cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [server_name(record.worker_id)]

        check = health_pb2.HealthCheckRequest()
        async with aio.insecure_channel(record.address) as plaintext:
            with pytest.raises(aio.AioRpcError) as refused:
                await health_pb2_grpc.HealthStub(plaintext).Check(check, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        mine = worker_channel(record.address, record.worker_id, True, secret.get_secret_value())
        async with mine:
            reply = await health_pb2_grpc.HealthStub(mine).Check(check, timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        other = next(r.worker_id for r in records if r.worker_id != record.worker_id)
        theirs = worker_channel(record.address, other, True, secret.get_secret_value())
        async with theirs:
            with pytest.raises(aio.AioRpcError) as mismatched:
                await health_pb2_grpc.HealthStub(theirs).Check(check, timeout=5)
        assert mismatched.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_gpu_check_reports_only_what_it_saw(cp: Controlplane) -> None:
    done = await cp.cli("pool", "check", "--pool", POOL, "--gpu", "RTXPro6000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "simulated cards: no GPU was visible, as expected\nCOMPLETE {" in done.stdout
    text = done.stdout[done.stdout.index("COMPLETE ") + len("COMPLETE ") :]
    result = json.loads(text)
    assert list(result) == ["host", "nvidia_smi", "cuda", "device", "matmul_ok"]
    assert result == {
        "host": "runc",  # the worker's own image: no task runs outside a container
        "nvidia_smi": None,
        "cuda": False,
        "device": None,
        "matmul_ok": None,
    }


async def _check_script(cp: Controlplane) -> subprocess.CompletedProcess[str]:
    script = Path(__file__).parents[2] / "deploy" / "gke" / "check-gke-pool.sh"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": cp.settings.temporal_address,
        "LEVERS9_TASK_QUEUE": cp.settings.task_queue,
        "LEVERS9": str(BIN / "levers9"),
    }
    return await asyncio.to_thread(
        subprocess.run,
        [str(script), "--gpu", "RTXPro6000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_check_script_wraps_the_check(cp: Controlplane) -> None:
    done = await _check_script(cp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETE {" in done.stdout


async def test_check_on_a_pool_not_marked_simulated_fails_when_no_card_is_seen(
    cp: Controlplane,
) -> None:
    """The same pool, its values without `simulatedGpus` (the schedule's memo, as the
    controlplane writes it from them): the container that saw no card fails the check, as on a
    real pool whose driver or device plugin is broken, and the script exits non-zero."""
    client = await connect(cp.settings)
    await sync_reconcile_schedules(client, [POOL], cp.settings)
    try:
        done = await _check_script(cp)
    finally:
        await sync_reconcile_schedules(client, [POOL], cp.settings, simulated_gpus=[POOL])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "simulated cards" not in done.stdout
    report = json.loads(done.stdout[done.stdout.index("FAILED ") + len("FAILED ") :])
    assert report["cuda"] is False
    assert report["reason"] == (
        "the container saw no GPU: check the node's driver and the device plugin"
    )


async def test_run_prints_output_and_the_task_sees_only_its_cards(cp: Controlplane) -> None:
    script = (
        "import json, os; print('hello from the task');"
        "open(os.environ['LEVERS9_RESULT_PATH'], 'w').write(json.dumps("
        "{'cards': os.environ['NVIDIA_VISIBLE_DEVICES']}))"
    )
    done = await cp.cli("run", "--pool", POOL, "--gpus", "2", "--", "python", "-c", script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello from the task" in done.stdout
    assert "succeeded exit_code=0" in done.stdout
    task_id = done.stdout.split()[1]
    record = await task_record(await connect(cp.settings), task_id)
    assert record is not None
    assert len(record.gpu_indices) == 2
    assert json.loads(record.result_json) == {
        "cards": ",".join(str(card) for card in record.gpu_indices)
    }
    assert [p.name for p in record.phases][:2] == ["placement", "worker.gpu_assignment"]


async def test_run_streams_output_as_the_worker_writes_it(cp: Controlplane) -> None:
    """The first line reaches the user while the task still runs, through the gateway's relay
    (no fallback to the record's tail); `task logs` then has the whole output, more than the
    record's tail keeps."""
    script = (
        "import sys, time; print('first line', flush=True); time.sleep(3);"
        "sys.stdout.write(''.join(f'line {i:06d}\\n' for i in range(3000)))"
    )
    process = await asyncio.create_subprocess_exec(
        str(BIN / "levers9"),
        *("run", "--pool", POOL, "--", "python", "-c", script),
        env=cp.cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    submitted = (await asyncio.wait_for(process.stdout.readline(), WITHIN)).decode()
    task_id = submitted.split()[1]
    first = await asyncio.wait_for(process.stdout.readline(), WITHIN)
    assert first == b"first line\n"
    record = await task_record(await connect(cp.settings), task_id)
    assert record is not None
    assert record.state in ("placed", "running"), record
    out, err = await asyncio.wait_for(process.communicate(), WITHIN)
    assert process.returncode == 0, out.decode() + err.decode()
    assert b"no log stream" not in err, err.decode()
    assert out.count(b"line 0") == 3000
    assert b"succeeded exit_code=0" in out

    logs = await cp.cli("task", "logs", task_id)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("first line\nline 000000\n")
    assert logs.stdout.endswith("line 002999\n")
    record = await task_record(await connect(cp.settings), task_id)
    assert record is not None
    assert "line 000000" not in record.log_tail  # the tail alone could not have shown it


async def test_logs_without_the_operator_token_are_refused_and_fall_back(
    cp: Controlplane,
) -> None:
    done = await cp.cli("run", "--pool", POOL, "--", "echo", "from the tail")
    task_id = done.stdout.split()[1]
    env = {**cp.cli_env(), "LEVERS9_API_TOKEN": "l9o1.forged"}
    logs = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "levers9"), "task", "logs", task_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert logs.returncode == 0, logs.stderr
    assert "UNAUTHENTICATED: operator token does not match" in logs.stderr
    assert "l9o1.forged" not in logs.stderr
    assert logs.stdout == "from the tail\n"


async def test_wait_zero_prints_deadline_exceeded_and_the_task_completes(
    cp: Controlplane,
) -> None:
    done = await cp.cli("run", "--pool", POOL, "--wait", "0", "--", "sleep", "1")
    assert done.returncode == 4
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("DEADLINE_EXCEEDED: task ")
    task_id = line.split()[2]
    assert line.endswith(f"is still running; levers9 task get {task_id}")

    async def completed() -> bool:
        record = await task_record(await connect(cp.settings), task_id)
        return record is not None and record.state == "succeeded"

    await eventually(completed, within=WITHIN)
    got = await cp.cli("task", "get", task_id, "-o", "json")
    assert json.loads(got.stdout)["exit_code"] == 0


def _with(cp: Controlplane, **changes: str) -> dict[str, str]:
    return {**cp.cli_env(), **changes}


async def _levers9(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "levers9"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_run_and_get_go_through_the_gateway(cp: Controlplane) -> None:
    """With the operator token the CLI needs no Temporal: pointed at a Temporal that is not
    there, `run` and `task get` still answer, from the gateway."""
    env = _with(cp, TEMPORAL_ADDRESS="127.0.0.1:9")
    done = await _levers9(env, "run", "--pool", POOL, "--", "echo", "via the gateway")
    assert done.returncode == 0, done.stderr
    assert "via the gateway" in done.stdout
    assert "asking Temporal directly" not in done.stderr
    task_id = done.stdout.split()[1]
    got = await _levers9(env, "task", "get", task_id, "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["state"] == "succeeded"
    listed = await _levers9(env, "task", "list", "--pool", POOL, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert "asking Temporal directly" not in listed.stderr
    rows = json.loads(listed.stdout)
    assert [row for row in rows if row["task_id"] == task_id] == [json.loads(got.stdout)]
    assert [row["created_at"] for row in rows] == sorted(
        (row["created_at"] for row in rows), reverse=True
    )


async def test_an_unreachable_gateway_falls_back_to_temporal_and_says_so(cp: Controlplane) -> None:
    env = _with(cp, LEVERS9_GATEWAY_ADDRESS="127.0.0.1:9")
    done = await _levers9(env, "run", "--pool", POOL, "--", "echo", "via temporal")
    assert done.returncode == 0, done.stderr
    assert "asking Temporal directly: the gateway at 127.0.0.1:9 did not answer" in done.stderr
    assert "succeeded exit_code=0" in done.stdout
    task_id = done.stdout.split()[1]
    listed = await _levers9(env, "task", "list", "-o", "json")  # its Temporal worker answers
    assert listed.returncode == 0, listed.stderr
    assert "asking Temporal directly: the gateway at 127.0.0.1:9" in listed.stderr
    assert task_id in {row["task_id"] for row in json.loads(listed.stdout)}


async def test_the_gateway_refuses_a_bad_submit_naming_the_field(cp: Controlplane) -> None:
    bad = await _levers9(cp.cli_env(), "run", "--pool", "Not_A_Pool", "--", "true")
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT: pool_name: 'Not_A_Pool' is not a pool name" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = await _levers9(cp.cli_env(), "task", "get", "nosuchtask0")
    assert missing.returncode == 1
    assert "no task nosuchtask0" in missing.stderr


async def test_task_api_checks_every_field_and_the_token(cp: Controlplane) -> None:
    """The gateway's Tasks service, called as any client would: each wrong field is named, a
    wrong token is refused without quoting it, a wait returns the ended record."""
    from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2
    from levers9.rpc import bearer
    from levers9.tokens import operator_token
    from tests.controlplane import TOKEN_SECRET

    metadata = bearer.metadata(operator_token(TOKEN_SECRET))

    def submit(gpus: int = 0, **task: Any) -> gateway_pb2.SubmitTaskRequest:
        spec = worker_pb2.TaskSpec(**{"task_id": "t1", "command": ["true"], **task})
        return gateway_pb2.SubmitTaskRequest(pool_name=POOL, gpus=gpus, task=spec)

    cases = [
        (submit(command=[]), "task.command: missing"),
        (submit(task_id=""), "task.task_id: missing"),
        (submit(task_id="t/1"), "task.task_id: 't/1' is not"),
        (submit(gpus=-1), "gpus: -1 is not"),
        (submit(command=["a\0b"]), "task.command: an argument holds"),
        (submit(image="a b"), "task.image: 'a b' is not"),
        (submit(image="Up/per"), "task.image: 'Up/per'"),
        (submit(stop_grace_seconds=-1), "task.stop_grace_seconds: -1 is not 0 to 3600 seconds"),
        (submit(gpu_indices=[0]), "task.gpu_indices: the placement picks the cards"),
        (submit(env={"a.b": ""}), "task.env: 'a.b' is not a variable name"),
        (submit(ready_path="/health"), "task.ready_path: needs a port to probe"),
        (submit(runtime="kata"), "task.runtime: unknown runtime 'kata': use one of runc, runsc"),
        (submit(runtime="process"), "task.runtime: unknown runtime 'process'"),
        (submit(runtime="runsc"), f"task.runtime: pool {POOL} does not offer runtime runsc"),
    ]
    async with aio.insecure_channel(cp.settings.gateway_advertised_address) as channel:
        stub = gateway_pb2_grpc.TasksStub(channel)
        for request, problem in cases:
            with pytest.raises(aio.AioRpcError) as refused:
                await stub.SubmitTask(request, metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, problem
            assert (refused.value.details() or "").startswith(problem)
        forged = bearer.metadata("l9o1.forged")
        with pytest.raises(aio.AioRpcError) as denied:
            await stub.SubmitTask(cases[0][0], metadata=forged, timeout=10)
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "l9o1.forged" not in (denied.value.details() or "")
        for wait in (-1.0, float("nan")):
            asked = gateway_pb2.GetTaskRecordRequest(task_id="t1", wait_seconds=wait)
            with pytest.raises(aio.AioRpcError) as invalid:
                await stub.GetTaskRecord(asked, metadata=metadata, timeout=10)
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        task = submit(task_id="api-wait-1", command=["sh", "-c", "sleep 1"])
        await stub.SubmitTask(task, metadata=metadata, timeout=10)
        await stub.SubmitTask(task, metadata=metadata, timeout=10)  # a retry starts nothing
        wait_for_end = gateway_pb2.GetTaskRecordRequest(task_id="api-wait-1", wait_seconds=30)
        reply = await stub.GetTaskRecord(wait_for_end, metadata=metadata, timeout=40)
    assert reply.record.state == "succeeded"
    assert reply.record.HasField("exit_code")
    assert reply.record.exit_code == 0


# Last: it shuts a worker down, and the module's other tests want all three.
async def test_worker_shut_down_mid_task_fails_it_with_the_reason(cp: Controlplane) -> None:
    done = await cp.cli("run", "--pool", POOL, "--gpus", "1", "--wait", "3", "--", "sleep", "60")
    assert done.returncode == 4
    task_id = done.stdout.strip().splitlines()[-1].split()[2]
    record = await task_record(await connect(cp.settings), task_id)
    assert record is not None
    assert record.state == "running"
    worker_pods = await cp.kubectl(
        "-n",
        "levers9",
        "get",
        "pods",
        "-l",
        f"levers9.dev/worker-id={record.worker_id}",
        "-o",
        "name",
    )
    await cp.kubectl("-n", "levers9", "delete", *worker_pods.split())

    async def failed() -> bool:
        got = await task_record(await connect(cp.settings), task_id)
        return got is not None and got.state in TERMINAL

    await eventually(failed, within=WITHIN)
    final = await task_record(await connect(cp.settings), task_id)
    assert final is not None
    # The pod's deletion stops its agent (SIGTERM), which reports its running task lost.
    assert (final.state, final.reason) == ("lost", "worker shut down")
