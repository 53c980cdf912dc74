"""The chart's values.schema.json is the pydantic models' own schema (regenerated with
`python -m levers9.schema`; stale is a failure), and the two agree: what the controlplane's loader
accepts the schema accepts, and what the schema refuses the loader refuses too."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from levers9.config import ConfigError, load_values, parse_pool, parse_settings
from levers9.devstack import values as devvalues
from levers9.schema import SCHEMA_PATH, render, values_schema
from sandbox.pki import mint_certificate_authority, mint_service_account_key

CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = json.dumps(
    mint_service_account_key(project="demo", account="levers9-controlplane", token_uri="https://x")
)
VALIDATOR = Draft202012Validator(values_schema())


def _values(pools: dict[str, Any], controlplane: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"worker": {"pools": pools}}
    if controlplane is not None:
        config["controlplane"] = controlplane
    return {"config": config}


def _errors(values: dict[str, Any]) -> list[str]:
    return [
        "/".join(str(p) for p in error.absolute_path) + f": {error.message}"
        for error in VALIDATOR.iter_errors(values)
    ]


def test_the_checked_in_schema_is_the_models_own() -> None:
    assert SCHEMA_PATH.read_text() == render(), "run: python -m levers9.schema"
    Draft202012Validator.check_schema(values_schema())


def test_the_dev_values_and_the_private_file_validate(tmp_path: Path) -> None:
    files = devvalues.write(
        tmp_path, ca_base64=CA, endpoint="https://127.0.0.1:6443", key_json=KEY, tunnel=True
    )
    public = load_values(files[:1])
    assert _errors(public) == []  # the pasted block alone, before the key is merged
    merged = load_values(files)
    assert _errors(merged) == []
    parse_pool(devvalues.POOL_NAME, merged["config"]["worker"]["pools"][devvalues.POOL_NAME])


def _block() -> dict[str, Any]:
    block = devvalues.pool_block(CA, "https://34.1.2.3")
    block["kubernetes"]["credentials"] = KEY
    return block


BAD_BLOCKS = {
    "unknown key": lambda b: b.update(gpuTyp="RTXPro6000"),
    "unknown kubernetes key": lambda b: b["kubernetes"].update(endpont="https://x"),
    "flavor": lambda b: b["kubernetes"].update(flavor="eks"),
    "no workerImage": lambda b: b["kubernetes"].pop("workerImage"),
    "mode": lambda b: b.update(mode="internal"),
    "cache": lambda b: b.update(cache={"enabled": "yes please"}),
    "simulatedGpus": lambda b: b.update(simulatedGpus="yes"),
}


@pytest.mark.parametrize("case", sorted(BAD_BLOCKS))
def test_what_the_schema_refuses_the_loader_refuses(case: str) -> None:
    block = _block()
    BAD_BLOCKS[case](block)
    errors = _errors(_values({"gke-rtx6000": block}))
    assert errors, f"the schema took a block with a bad {case}"
    assert all(e.startswith("config/worker/pools/gke-rtx6000") for e in errors), errors
    with pytest.raises(ConfigError):
        parse_pool("gke-rtx6000", copy.deepcopy(block))


def test_the_spec_block_and_another_providers_pool_are_accepted() -> None:
    block = _block()
    parse_pool("gke-rtx6000", copy.deepcopy(block))
    other = {"mode": "external", "provider": "aws", "region": "us-east-1"}
    assert _errors(_values({"gke-rtx6000": block, "old-aws": other})) == []


def test_the_dev_values_say_their_cards_are_simulated_and_the_spec_block_does_not(
    tmp_path: Path,
) -> None:
    files = devvalues.write(tmp_path, ca_base64=CA, endpoint="https://127.0.0.1:6443", key_json=KEY)
    merged = load_values(files)["config"]["worker"]["pools"][devvalues.POOL_NAME]
    assert parse_pool(devvalues.POOL_NAME, merged).simulated_gpus is True
    assert parse_pool("gke-rtx6000", _block()).simulated_gpus is False


def test_a_simulated_gpus_that_is_not_a_boolean_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_pool("gke-rtx6000", {**_block(), "simulatedGpus": "yes"})
    assert "config.worker.pools.gke-rtx6000.simulatedGpus" in str(refused.value)


def test_controlplane_settings_keys_are_the_settings_own() -> None:
    settings = {"temporalAddress": "temporal.example:7233", "taskQueue": "q", "tunnel": True}
    errors = _errors(_values({}, settings))
    assert errors == [
        "config/controlplane: Additional properties are not allowed ('tunnel' was unexpected)"
    ]
    del settings["tunnel"]
    assert _errors(_values({}, settings)) == []
    parse_settings(settings)
