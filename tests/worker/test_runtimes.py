"""The runtime registry (`levers9.worker.runtimes`): one factory per name the values accept
(`levers9.contract.RUNTIMES`), none unnamed; a pool's runtime found by its name, and a name with
no factory (unknown, or `runsc`, reserved) refused naming the setting and the names known; what
each factory builds for a task with and without an image."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from levers9.contract import DEFAULT_RUNTIME, RUNTIMES
from levers9.worker import runtimes
from levers9.worker.driver import DriverSetup
from levers9.worker.runtime import Runtime
from levers9.worker.runtimes import RuntimeContext
from levers9.worker.settings import SettingsError, WorkerSettings
from tests.worker.kit import TOKEN, sandbox_paths

IMAGE = "us-docker.pkg.dev/p/r/torch:2.5"


def _settings(**env: str) -> WorkerSettings:
    base = {
        "LEVERS9_GATEWAY_ADDRESS": "127.0.0.1:1",
        "LEVERS9_POOL_NAME": "gke-rtx6000",
        "LEVERS9_WORKER_ID": "w1",
        "LEVERS9_WORKER_TOKEN": TOKEN,
    }
    return WorkerSettings.from_env({**base, **{f"LEVERS9_{k.upper()}": v for k, v in env.items()}})


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
def test_a_known_runtime_is_found_by_its_name(name: str) -> None:
    assert runtimes.factory(_settings(runtime=name)) is runtimes.RUNTIMES[name]


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("kata", "unknown runtime 'kata': use one of process, runc"),
        (
            "runsc",
            "runsc (gVisor) is reserved and not yet available in this version: use one of"
            " process, runc",
        ),
    ],
)
def test_a_runtime_without_a_factory_is_refused_naming_the_setting(name: str, problem: str) -> None:
    with pytest.raises(SettingsError) as raised:
        runtimes.factory(_settings(runtime=name))
    assert str(raised.value) == (
        f"LEVERS9_RUNTIME (the pool's runtime, config.worker.pools.gke-rtx6000.runtime): {problem}"
    )


def test_process_runs_every_task_as_a_process(node_root: Path, tmp_path: Path) -> None:
    runtime = _build(_settings(runtime="process", images_path="/images"), node_root, tmp_path)
    assert (runtime.host_for(""), runtime.host_for(IMAGE)) == ("process", "process")


@pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("runc", "umoci", "skopeo")),
    reason="the runc runtime needs root, runc, umoci and skopeo (CI and the worker Job have them)",
)
def test_runc_runs_an_image_under_runc_and_a_task_of_none_as_a_process(
    node_root: Path, tmp_path: Path
) -> None:
    runtime = _build(_settings(runtime="runc", images_path="/images"), node_root, tmp_path)
    assert (runtime.host_for(IMAGE), runtime.host_for("")) == ("runc", "process")
    assert (node_root / "images").is_dir(), "its image cache is the pool's imagesPath, mapped"
