"""The runtime registry (`levers9.agent.runtimes`): one factory per name the values accept
(`levers9.contract.RUNTIMES`), none unnamed; a pool's runtime found by its name, and a name with
no factory refused naming the setting and the names known; what each factory builds for a task
with and without an image (a process only under the agent's tests' knob,
`LEVERS9_PROCESS_TASKS`); a pool offering more than one runs each task in the one it names."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from levers9.agent import runtimes
from levers9.agent.driver import DriverSetup
from levers9.agent.runtime import ContainerSpec, Runtime, StartError
from levers9.agent.runtimes import RuntimeContext
from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.contract import DEFAULT_RUNTIME, RUNTIMES, TASK_RUNTIMES
from tests.agent.kit import TOKEN, sandbox_paths

IMAGE = "us-docker.pkg.dev/p/r/torch:2.5"


def _settings(**env: str) -> WorkerSettings:
    base = {
        "LEVERS9_GATEWAY_ADDRESS": "127.0.0.1:1",
        "LEVERS9_POOL_NAME": "gke-rtx6000",
        "LEVERS9_WORKER_ID": "w1",
        "LEVERS9_WORKER_TOKEN": TOKEN,
    }
    return WorkerSettings.from_env({**base, **{f"LEVERS9_{k.upper()}": v for k, v in env.items()}})


def _spec(tmp_path: Path, runtime: str) -> ContainerSpec:
    return ContainerSpec(
        "t", IMAGE, ("true",), {}, (), tmp_path / "r.json", tmp_path, runtime=runtime
    )


def _build(settings: WorkerSettings, node_root: Path, tmp_path: Path) -> Runtime:
    (node_root / "usr/local/nvidia/lib64").mkdir(parents=True, exist_ok=True)
    context = RuntimeContext(
        settings, sandbox_paths(node_root), {}, DriverSetup((), (), ()), tmp_path / "work", ()
    )
    return runtimes.factory(settings)(context)


def test_every_runtime_the_values_accept_has_a_factory_and_no_other() -> None:
    assert tuple(runtimes.RUNTIMES) == RUNTIMES
    assert _settings().runtime == DEFAULT_RUNTIME == "runc"


@pytest.mark.parametrize("name", RUNTIMES)
async def test_a_task_asking_for_a_runtime_its_pool_does_not_offer_fails_naming_those_it_does(
    name: str, node_root: Path, tmp_path: Path
) -> None:
    other = next(n for n in TASK_RUNTIMES if n != name)
    runtime = _build(_settings(runtime=name, process_tasks="true"), node_root, tmp_path)
    with pytest.raises(StartError) as raised:
        await runtime.start(_spec(tmp_path, other), lambda _: None)
    assert str(raised.value) == f"this worker's pool offers the runtimes {name}, not {other}"


@pytest.mark.parametrize("setting", ["runtime", "runtimes"])
def test_a_runtime_without_a_factory_is_refused_naming_the_setting(setting: str) -> None:
    with pytest.raises(SettingsError) as raised:
        runtimes.factory(_settings(**{setting: "kata"}))
    assert str(raised.value) == (
        f"LEVERS9_{setting.upper()} (the pool's {setting}, config.worker.pools.gke-rtx6000"
        f".{setting}): unknown runtime 'kata': use one of process, runc, runsc"
    )


def test_process_runs_every_task_as_a_process(node_root: Path, tmp_path: Path) -> None:
    settings = _settings(runtime="process", images_path="/images", process_tasks="true")
    runtime = _build(settings, node_root, tmp_path)
    assert (runtime.host_for(""), runtime.host_for(IMAGE)) == ("process", "process")


def test_process_is_refused_without_the_tests_knob() -> None:
    """No Job sets LEVERS9_PROCESS_TASKS: a worker whose Job said process would not start."""
    with pytest.raises(SettingsError) as raised:
        _build(_settings(runtime="process"), Path("/nonexistent"), Path("/nonexistent"))
    assert "only the agent's own tests take it, with LEVERS9_PROCESS_TASKS set" in str(raised.value)


RUNC = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("runc", "umoci", "skopeo")),
    reason="the runc runtime needs root, runc, umoci and skopeo (CI and the worker Job have them)",
)


@RUNC
async def test_runc_runs_a_task_of_none_nowhere_outside_a_container(
    node_root: Path, tmp_path: Path
) -> None:
    """The agent gives such a task the pool's or its own image first; none left, it is refused."""
    runtime = _build(_settings(runtime="runc", images_path="/images"), node_root, tmp_path)
    assert (runtime.host_for(IMAGE), runtime.host_for("")) == ("runc", "runc")
    assert (node_root / "images").is_dir(), "its image cache is the pool's imagesPath, mapped"
    spec = ContainerSpec("t", "", ("true",), {}, (), tmp_path / "r.json", tmp_path)
    with pytest.raises(StartError) as raised:
        await runtime.start(spec, lambda _: None)
    assert str(raised.value).startswith("the task names no image and this worker has none")


@RUNC
def test_runc_runs_a_task_of_none_as_a_process_under_the_tests_knob(
    node_root: Path, tmp_path: Path
) -> None:
    settings = _settings(runtime="runc", images_path="/images", process_tasks="true")
    runtime = _build(settings, node_root, tmp_path)
    assert (runtime.host_for(IMAGE), runtime.host_for("")) == ("runc", "process")


CONTAINERS = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("runc", "runsc", "umoci", "skopeo")),
    reason="the runc and runsc runtimes need root, runc, runsc, umoci and skopeo",
)


@CONTAINERS
def test_runsc_runs_every_task_in_gvisor(node_root: Path, tmp_path: Path) -> None:
    runtime = _build(_settings(runtime="runsc", images_path="/images"), node_root, tmp_path)
    assert (runtime.host_for(IMAGE), runtime.host_for("")) == ("runsc", "runsc")


@CONTAINERS
def test_a_pool_offering_both_runs_a_task_in_the_one_it_names(
    node_root: Path, tmp_path: Path
) -> None:
    settings = _settings(runtime="runc", runtimes="runc,runsc", images_path="/images")
    assert settings.offered_runtimes() == ("runc", "runsc")
    runtime = _build(settings, node_root, tmp_path)
    assert [runtime.host_for(IMAGE, name) for name in ("", "runc", "runsc")] == [
        "runc",
        "runc",
        "runsc",
    ]


async def test_runsc_without_images_is_offered_but_fails_its_tasks_saying_why(
    node_root: Path, tmp_path: Path
) -> None:
    runtime = _build(_settings(runtime="runc", runtimes="runsc"), node_root, tmp_path)
    assert runtime.host_for(IMAGE, "runsc") == "runsc"
    spec = ContainerSpec(
        "t", IMAGE, ("true",), {}, (), tmp_path / "r.json", tmp_path, runtime="runsc"
    )
    with pytest.raises(StartError) as raised:
        await runtime.start(spec, lambda _: None)
    assert str(raised.value) == (
        "this worker cannot run runsc tasks: the Job sets no LEVERS9_IMAGES_PATH (the pool's"
        " imagesPath)"
    )
