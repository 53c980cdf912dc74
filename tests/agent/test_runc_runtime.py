"""The runc runtime with the real runc, umoci and skopeo and a real registry: a task runs in its
image (its Cmd, Env, WorkingDir and User honoured, the command replacing Cmd), in its own PID
namespace, sees only its own cards' device nodes and nothing of the agent's environment or
files, writes its result where the agent reads it, is stopped by SIGTERM then SIGKILL, dies at
its memory limit, and `exec` runs inside it. Its container is annotated with its task, workspace
and pool (`runc state`), which neither a bad workspace name nor the image's labels can forge.
Root only (runc creates namespaces and mounts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from levers9.agent.cdi import CdiError
from levers9.agent.cgroups import cgroup_dirs
from levers9.agent.images import ImageCache
from levers9.agent.runc_config import Limits
from levers9.agent.runc_container import RuncContainer, container_id
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import ContainerSpec, StartError
from levers9.agent.supervisor import TaskManager
from levers9.agent.task_errors import InvalidTask
from levers9.agent.task_network import open_connection
from levers9.proto import worker_pb2
from sandbox.cluster.kubelet import make_device_nodes
from sandbox.registries import LocalRegistry, push_layout
from sandbox.task_images import build_busybox
from tests.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)"),
]
AGENT_SECRET = "l9w1.the-agents-own-token"


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    """A node's /dev as the NVIDIA driver makes it: four cards and the control device."""
    dev = tmp_path / "dev"
    make_device_nodes(dev, 4)
    return dev


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    """The node's /usr/local/nvidia: its libraries' folder and one marker file."""
    root = tmp_path / "nvidia"
    (root / "lib64").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "lib64" / "libnvidia-ml.so.1").write_text("the node's driver")
    return root


@pytest.fixture
def runtime(
    image: tuple[LocalRegistry, str], tmp_path: Path, devices: Path, driver: Path
) -> RuncRuntime:
    registry, _ = image
    cache = ImageCache(tmp_path / "images", insecure=[registry.address])
    return RuncRuntime(
        cache,
        tmp_path / "runc",
        dev_root=devices,
        driver_root=driver,
        limits=Limits(memory_bytes=64 * 1024**2, cpus=1, pids=256),
    )


def _spec(tmp_path: Path, image: str, *command: str, cards: tuple[int, ...] = ()) -> ContainerSpec:
    task = tmp_path / "task"
    return ContainerSpec(
        task_id=f"t{abs(hash(command)) % 10**8}",
        image=image,
        command=command,
        env={"TASK_VAR": "mine"},
        gpu_indices=cards,
        result_path=task / "result.json",
        work_dir=task / "work",
    )


def _mounts_under(path: Path) -> str:
    return "".join(
        line for line in Path("/proc/mounts").read_text().splitlines(True) if str(path) in line
    )


async def _run(runtime: RuncRuntime, spec: ContainerSpec) -> tuple[int, str]:
    out = bytearray()
    container = await runtime.start(spec, out.extend)
    code = await asyncio.wait_for(container.wait(), 60)
    return code, out.decode()


async def test_the_image_config_is_honoured(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    code, out = await _run(runtime, _spec(tmp_path, image[1]))
    assert (code, out) == (0, "hello from busybox\n"), "the image's Cmd"
    script = 'id -u; pwd; echo "$IMAGE_GREETING $TASK_VAR"; cat /etc/levers9-marker; exit 3'
    code, out = await _run(runtime, _spec(tmp_path, image[1], "sh", "-c", script))
    assert code == 3
    assert out.splitlines() == ["1000", "/work", "hello mine", "runc"]


async def test_own_pid_namespace_and_nothing_of_the_agent(
    runtime: RuncRuntime,
    image: tuple[LocalRegistry, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEVERS9_WORKER_TOKEN", AGENT_SECRET)
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "token").write_text(AGENT_SECRET)
    script = (
        "ps -o pid,comm; echo ---; env; echo ---; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n';"
        f" echo ---; cat {secret_dir}/token /proc/{os.getpid()}/environ 2>&1; true"
    )
    code, out = await _run(runtime, _spec(tmp_path, image[1], "sh", "-c", script))
    assert code == 0
    processes, env, _environs, files = out.split("---\n")
    pids = [line.split()[0] for line in processes.splitlines()[1:]]
    assert pids[0] == "1", "the task's command is PID 1 of its own namespace"
    assert len(pids) <= 3, processes
    assert "TASK_VAR=mine" in env.splitlines()
    assert "LEVERS9_WORKER" not in out
    assert AGENT_SECRET not in out
    assert "No such file or directory" in files


async def test_only_its_own_cards(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = _spec(
        tmp_path,
        image[1],
        "sh",
        "-c",
        "ls /dev | grep nvidia; echo $NVIDIA_VISIBLE_DEVICES",
        cards=(1, 3),
    )
    code, out = await _run(runtime, spec)
    assert code == 0
    assert out.splitlines() == ["nvidia1", "nvidia3", "nvidiactl", "1,3"]
    none = _spec(tmp_path, image[1], "sh", "-c", "ls /dev | grep -c nvidia; true")
    assert await _run(runtime, none) == (0, "0\n")


async def test_a_card_the_cdi_spec_does_not_hold_fails_the_start(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = json.loads(runtime.cdi_spec.read_text())
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "2", "3"]
    with pytest.raises(StartError, match=r"^unresolvable CDI devices nvidia.com/gpu=7$"):
        await runtime.start(_spec(tmp_path, image[1], "true", cards=(7,)), lambda _: None)


async def test_the_driver_is_mounted_read_only_for_a_task_with_cards(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    script = (
        "cat /usr/local/nvidia/lib64/libnvidia-ml.so.1; echo; echo $LD_LIBRARY_PATH;"
        " (echo x > /usr/local/nvidia/lib64/mine) 2>/dev/null || echo read-only"
    )
    code, out = await _run(runtime, _spec(tmp_path, image[1], "sh", "-c", script, cards=(1,)))
    assert (code, out.splitlines()) == (
        0,
        ["the node's driver", "/usr/local/nvidia/lib64", "read-only"],
    )
    code, out = await _run(
        runtime, _spec(tmp_path, image[1], "sh", "-c", "ls /usr/local/nvidia 2>&1 | wc -l")
    )
    assert (code, out.strip()) == (0, "1"), "a task without a card gets no driver: " + out


def test_no_cdi_spec_without_the_drivers_libraries(
    image: tuple[LocalRegistry, str], tmp_path: Path, devices: Path
) -> None:
    cache = ImageCache(tmp_path / "images", insecure=[image[0].address])
    with pytest.raises(CdiError, match=r"^failed to generate CDI spec: no driver libraries at"):
        RuncRuntime(cache, tmp_path / "runc", dev_root=devices, driver_root=tmp_path / "none")
    with pytest.raises(CdiError, match=r"^failed to generate CDI spec: .*nvidia5 is missing"):
        RuncRuntime(cache, tmp_path / "runc", dev_root=devices, cards=(0, 5))
    bare = RuncRuntime(cache, tmp_path / "runc", dev_root=tmp_path / "empty", cards=())
    assert json.loads(bare.cdi_spec.read_text())["devices"] == [], "no card, nothing needed"


async def test_the_result_file_reaches_the_agent(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    spec = _spec(tmp_path, image[1], "sh", "-c", 'echo \'{"ok": true}\' > "$LEVERS9_RESULT_PATH"')
    assert await _run(runtime, spec) == (0, "")
    assert spec.result_path.read_text() == '{"ok": true}\n'


async def test_stop_and_exec(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    container = await runtime.start(_spec(tmp_path, image[1], "sleep", "60"), lambda _: None)
    assert isinstance(container, RuncContainer)
    try:
        process = await runtime.exec(container, ["cat", "/etc/levers9-marker"])
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert (process.returncode, out) == (0, b"runc")
    finally:
        code = await asyncio.wait_for(container.stop(grace_s=1), 30)
    assert code in (128 + 15, 128 + 9)
    assert " overlay " not in _mounts_under(tmp_path), "the task's overlay is gone with it"


async def test_over_its_memory_limit_it_is_killed(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    grow = 'x=a; while true; do x="$x$x"; done'
    out = bytearray()
    container = await runtime.start(_spec(tmp_path, image[1], "sh", "-c", grow), out.extend)
    assert await asyncio.wait_for(container.wait(), 60) == 128 + 9
    assert container.oom_killed, "the kernel's OOM killer, not another SIGKILL"
    stopped = await runtime.start(_spec(tmp_path, image[1], "sleep", "30"), lambda _: None)
    assert await asyncio.wait_for(stopped.stop(grace_s=0), 30) == 128 + 9
    assert not stopped.oom_killed


async def test_a_missing_image_fails_the_start_naming_it(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    missing = f"{image[0].address}/tasks/busybox:nope"
    with pytest.raises(StartError, match=f"cannot pull {missing}: .*manifest unknown"):
        await runtime.start(_spec(tmp_path, missing, "true"), lambda _: None)


IGNORES_TERM = (
    "trap '' TERM; busybox httpd -f -p {port} & sh -c \"trap '' TERM; sleep 1000\" &"
    " echo up; sleep 1000"
)
"""PID 1 and two children (one holding a port) that all ignore SIGTERM."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _port_taken(netns: Path | None, port: int) -> bool:
    """Whether something listens on `port` in the container's own network namespace."""
    assert netns is not None, "a runc container has a network of its own"
    try:
        _, writer = await open_connection(netns, port)
    except OSError:
        return False
    writer.close()
    return True


async def _runc_containers(runtime: RuncRuntime) -> list[str]:
    listed = await asyncio.create_subprocess_exec(
        *runtime._runc_argv("list", "-q"), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await listed.communicate()
    return out.decode().split()


async def test_a_container_that_ignores_sigterm_is_gone_after_its_grace(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    port = _free_port()
    out = bytearray()
    spec = _spec(tmp_path, image[1], "sh", "-c", IGNORES_TERM.format(port=port))
    container = await runtime.start(spec, out.extend)
    netns = container.netns
    await eventually(lambda: _listening(netns, port, b"up" in out), within=30)
    assert cgroup_dirs(spec.task_id), "the container's cgroup, while it runs"
    code = await asyncio.wait_for(container.stop(grace_s=1), 30)
    assert code == 128 + 9, "killed after its grace, having ignored SIGTERM"
    assert await _runc_containers(runtime) == []
    assert cgroup_dirs(spec.task_id) == [], "no cgroup (so no process) of it is left"
    assert netns is not None
    assert not netns.parent.exists(), "its network (and its port) is gone once stop returns"


async def _true(value: bool) -> bool:
    return value


async def _listening(netns: Path | None, port: int, said_up: bool) -> bool:
    return said_up and await _port_taken(netns, port)


async def test_cancel_ends_a_task_that_ignores_sigterm_even_when_its_caller_gives_up(
    runtime: RuncRuntime, image: tuple[LocalRegistry, str], tmp_path: Path
) -> None:
    port = _free_port()
    reports: list[worker_pb2.TaskStatus] = []
    tasks = TaskManager(runtime, (), tmp_path / "work", reports.append)
    spec = worker_pb2.TaskSpec(
        task_id="ignores-term",
        image=image[1],
        command=["sh", "-c", IGNORES_TERM.format(port=port)],
        stop_grace_seconds=1,
    )
    await tasks.run(spec)
    netns = tasks._record(spec.task_id).container.netns  # type: ignore[union-attr]
    await eventually(lambda: _listening(netns, port, "up" in tasks.output(spec.task_id).tail()))
    with pytest.raises(TimeoutError):  # the caller's deadline, well inside the grace
        await asyncio.wait_for(tasks.cancel(spec.task_id), 0.2)

    def ended() -> list[worker_pb2.TaskStatus]:
        return [r for r in reports if r.state != worker_pb2.TASK_STATE_RUNNING]

    await eventually(lambda: _true(bool(ended())))
    assert [(r.state, r.exit_code, r.reason) for r in ended()] == [
        (worker_pb2.TASK_STATE_CANCELLED, 128 + 9, "cancelled")
    ]
    assert await _runc_containers(runtime) == []
    # The end is reported once runc has reaped it; its cgroups go right after (a loaded machine
    # showed all ten still there at the report).
    await eventually(lambda: _true(cgroup_dirs(spec.task_id) == []))
    assert netns is not None
    assert not netns.parent.exists(), "its network (and its port) went with it"


@pytest.fixture(scope="module")
def labelled_image(
    image: tuple[LocalRegistry, str], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The busybox image with labels that claim another task, workspace and pool, and one more
    under `levers9.` (umoci makes an image's labels its container's annotations)."""
    registry, _ = image
    layout = build_busybox(tmp_path_factory.mktemp("labelled") / "layout", "lb", marker="runc")
    subprocess.run(
        [
            "umoci",
            "config",
            "--image",
            f"{layout}:lb",
            "--config.label=levers9.workspace=team-b",
            "--config.label=levers9.task=someone-else",
            "--config.label=levers9.pool=other",
            "--config.label=levers9.borrowed=true",
            "--config.label=org.example.kept=yes",
        ],
        check=True,
        capture_output=True,
    )
    reference = f"{registry.address}/tasks/busybox:labelled"
    push_layout(layout, reference, "lb")
    return reference


@pytest.fixture
def tasks(runtime: RuncRuntime, tmp_path: Path) -> TaskManager:
    return TaskManager(runtime, (), tmp_path / "work", lambda _: None, pool_name="pool-a")


async def _runc_state(runtime: RuncRuntime, task_id: str) -> dict[str, object]:
    container = container_id(task_id)
    shown = await asyncio.create_subprocess_exec(
        *runtime._runc_argv("state", container), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await shown.communicate()
    assert shown.returncode == 0, f"runc state {container}"
    state: dict[str, object] = json.loads(out)
    return state


@pytest.mark.parametrize("labelled", [False, True], ids=["plain", "image-labels-claim-them"])
async def test_its_container_is_annotated_with_its_task_workspace_and_pool(
    runtime: RuncRuntime,
    tasks: TaskManager,
    image: tuple[LocalRegistry, str],
    labelled_image: str,
    labelled: bool,
) -> None:
    spec = worker_pb2.TaskSpec(
        task_id="annotated",
        image=labelled_image if labelled else image[1],
        command=["sleep", "60"],
        workspace="team-a",
        stop_grace_seconds=1,
    )
    await tasks.run(spec)
    try:
        await eventually(lambda: _true(tasks._record(spec.task_id).container is not None))
        annotations = (await _runc_state(runtime, spec.task_id))["annotations"]
        assert isinstance(annotations, dict)
        ours = {k: v for k, v in annotations.items() if k.startswith("levers9.")}
        assert ours == {
            "levers9.task": "annotated",
            "levers9.workspace": "team-a",
            "levers9.pool": "pool-a",
        }
        if labelled:
            assert annotations["org.example.kept"] == "yes", "the image's other labels stay"
    finally:
        await tasks.cancel(spec.task_id)


async def test_a_task_of_no_workspace_is_annotated_default(
    runtime: RuncRuntime, tasks: TaskManager, image: tuple[LocalRegistry, str]
) -> None:
    spec = worker_pb2.TaskSpec(
        task_id="older-controlplane", image=image[1], command=["sleep", "60"]
    )
    await tasks.run(spec)
    try:
        await eventually(lambda: _true(tasks._record(spec.task_id).container is not None))
        annotations = (await _runc_state(runtime, spec.task_id))["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["levers9.workspace"] == "default"
    finally:
        await tasks.cancel(spec.task_id)


REFUSED_WORKSPACE = r"^workspace .*(DNS label|at most 40 characters)"


@pytest.mark.parametrize(
    "workspace", ["Team-A", "team-a\nlevers9.workspace=team-b", "a" * 41, "-team"]
)
async def test_a_workspace_that_is_no_workspace_name_is_refused_before_anything_runs(
    runtime: RuncRuntime,
    tasks: TaskManager,
    image: tuple[LocalRegistry, str],
    tmp_path: Path,
    workspace: str,
) -> None:
    spec = worker_pb2.TaskSpec(
        task_id="forged", image=image[1], command=["true"], workspace=workspace
    )
    with pytest.raises(InvalidTask, match=REFUSED_WORKSPACE):
        await tasks.run(spec)
    direct = dataclasses.replace(_spec(tmp_path, image[1], "true"), workspace=workspace)
    with pytest.raises(StartError, match=REFUSED_WORKSPACE):
        await runtime.start(direct, lambda _: None)
    assert await _runc_containers(runtime) == []
