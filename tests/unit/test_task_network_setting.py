"""The pool's `taskNetwork.allow`: CIDRs checked in the values (a bad one names the field), carried
to the worker by its Job's environment (`LEVERS9_TASK_NETWORK_ALLOW`), read back by the agent
as the networks its tasks' rules let through (a bad one names the variable)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from activities.kube import worker_spec
from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.config import ConfigError, parse_pool, parse_settings
from levers9.core.manifests import worker_job
from levers9.models import WorkerJobInput
from tests.factories import key_json, spec_pool

POOL = "gke-rtx6000"


def _worker_env(block: dict[str, Any]) -> dict[str, str]:
    pool = parse_pool(POOL, block)
    job_input = WorkerJobInput(pool_name=POOL, worker_id="a1b2c3d4", gpus=1)
    job = worker_job(worker_spec(job_input, pool, parse_settings({})))
    [container] = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_allowed_cidrs_reach_the_agent() -> None:
    block = spec_pool(credentials=key_json())
    assert "LEVERS9_TASK_NETWORK_ALLOW" not in _worker_env(block), "none by default"
    block["taskNetwork"] = {"allow": ["10.8.0.0/16", "fd12::/16"]}
    env = _worker_env(block)
    assert env["LEVERS9_TASK_NETWORK_ALLOW"] == "10.8.0.0/16,fd12::/16"
    env.pop("LEVERS9_CREDENTIALS_DIR")  # the token's files are the Secret's, not here
    settings = WorkerSettings.from_env({**env, "LEVERS9_WORKER_TOKEN": "l9w1.t"})
    assert settings.task_network_allowed() == (
        ipaddress.ip_network("10.8.0.0/16"),
        ipaddress.ip_network("fd12::/16"),
    )


@pytest.mark.parametrize("bad", ["10.1.2.3/8", "10.0.0.0/33", "model-store"])
def test_a_bad_cidr_is_refused_naming_the_field(bad: str) -> None:
    block = spec_pool(credentials=key_json())
    block["taskNetwork"] = {"allow": ["10.8.0.0/16", bad]}
    with pytest.raises(ConfigError) as caught:
        parse_pool(POOL, block)
    [error] = caught.value.errors
    assert error.startswith(
        f"config.worker.pools.{POOL}.taskNetwork.allow: {bad!r} is not a CIDR ("
    ), error
    assert error.endswith("write a network such as 10.8.0.0/16"), error


def test_a_bad_cidr_in_the_agents_environment_names_the_variable() -> None:
    settings = WorkerSettings.from_env(
        {
            "LEVERS9_GATEWAY_ADDRESS": "127.0.0.1:7443",
            "LEVERS9_POOL_NAME": POOL,
            "LEVERS9_WORKER_ID": "a1b2c3d4",
            "LEVERS9_WORKER_TOKEN": "l9w1.t",
            "LEVERS9_TASK_NETWORK_ALLOW": "10.8.0.0/16,10.1.2.3/8",
        }
    )
    with pytest.raises(SettingsError, match=r"^LEVERS9_TASK_NETWORK_ALLOW: '10.1.2.3/8' is not"):
        settings.task_network_allowed()
