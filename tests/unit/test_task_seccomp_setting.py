"""The pool's `taskSeccompProfile`: an absolute node path in the values (a relative one refused
naming the field), carried to the worker by its Job (`LEVERS9_TASK_SECCOMP_PROFILE`, the file
mounted read-only at the same path); none by default (the agent's own, moby's)."""

from __future__ import annotations

from typing import Any

import pytest

from activities.kube import worker_spec
from levers9.config import ConfigError, parse_pool, parse_settings
from levers9.core.manifests import worker_job
from levers9.models import WorkerJobInput
from tests.factories import key_json, spec_pool

POOL = "gke-rtx6000"
PROFILE = "/etc/levers9/seccomp/tasks.json"


def _container(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pool = parse_pool(POOL, block)
    job_input = WorkerJobInput(pool_name=POOL, worker_id="a1b2c3d4", gpus=1)
    job = worker_job(worker_spec(job_input, pool, parse_settings({})))
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return container, pod["volumes"]


def test_the_profile_reaches_the_agent_read_only() -> None:
    block = spec_pool(credentials=key_json())
    container, volumes = _container(block)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "LEVERS9_TASK_SECCOMP_PROFILE" not in env, "the agent's default"
    assert all(v["name"] != "seccomp-profile" for v in volumes)

    block["taskSeccompProfile"] = PROFILE
    container, volumes = _container(block)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEVERS9_TASK_SECCOMP_PROFILE"] == PROFILE
    [volume] = [v for v in volumes if v["name"] == "seccomp-profile"]
    assert volume["hostPath"] == {"path": PROFILE, "type": "File"}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "seccomp-profile"]
    assert mount == {"name": "seccomp-profile", "mountPath": PROFILE, "readOnly": True}


def test_a_relative_path_is_refused_naming_the_field() -> None:
    block = spec_pool(credentials=key_json())
    block["taskSeccompProfile"] = "tasks.json"
    with pytest.raises(ConfigError) as caught:
        parse_pool(POOL, block)
    [error] = caught.value.errors
    assert error.startswith(f"config.worker.pools.{POOL}.taskSeccompProfile: "), error
    assert "must be an absolute path on the node" in error
