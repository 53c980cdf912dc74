"""The Helm chart's `values.schema.json`, generated from the pydantic models that the controlplane
itself validates values with (they are the source of truth; a test fails when the checked-in
file is stale): `python -m levers9.schema`.

`config.worker.pools.<name>` with `provider: kubernetes` takes exactly the spec's block (unknown
keys refused, the block's defaults and enums as the models have them); a pool of another
provider is left to the controlplane that owns it (this one logs `unable to load controller`
and goes on). `config.controlplane` takes the settings' values keys. What JSON Schema cannot say
(`credentials` xor `credentialsFile`, `hostNetwork: false` only with the tunnel, a parseable
key) the controlplane checks at start, naming the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from levers9.config import PROVIDER, ControlplaneSettings, PoolConfig

SCHEMA_PATH = (
    Path(__file__).resolve().parent.parent
    / "deploy"
    / "helm"
    / "levers9-controlplane"
    / "values.schema.json"
)


def _hoisted(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$defs` moved into `defs` (one shared table at the root)."""
    defs.update(schema.pop("$defs", {}))
    return schema


# Settings the controlplane takes from the environment that are secrets: the chart refuses them in
# `extraEnv` (they belong in the private values file, which lands in a Secret mounted as a file).
SECRET_ENV = (
    "LEVERS9_API_TOKEN",
    "LEVERS9_TEMPORAL_API_KEY",
    "LEVERS9_WORKER_TOKEN_SECRET",
    "TEMPORAL_API_KEY",
)

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


def chart_properties() -> dict[str, Any]:
    """The chart's own keys (values.yaml beside `config`); unknown keys are refused, so a typo
    fails `helm` instead of being ignored."""
    env_var = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "not": {"enum": list(SECRET_ENV)},
                "description": "secrets go in the private values file, not the environment",
            }
        },
    }
    return {
        "replicaCount": {"type": "integer", "minimum": 0},
        "image": _closed(
            {
                "repository": {"type": "string", "minLength": 1},
                "tag": {"type": "string"},
                "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
            }
        ),
        "imagePullSecrets": {"type": "array", "items": {"type": "object"}},
        "serviceAccount": _closed(
            {
                "create": {"type": "boolean"},
                "name": {"type": "string"},
                "annotations": _STRING_MAP,
            }
        ),
        "gateway": _closed(
            {
                "port": _PORT,
                "service": _closed(
                    {
                        "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                        "annotations": _STRING_MAP,
                        "loadBalancerSourceRanges": {"type": "array", "items": {"type": "string"}},
                    }
                ),
            }
        ),
        "metrics": _closed(
            {"enabled": {"type": "boolean"}, "port": _PORT, "podAnnotations": {"type": "boolean"}}
        ),
        "temporalTls": _closed({"existingSecret": {"type": "string"}}),
        "gatewayTls": _closed(
            {
                "existingSecret": {"type": "string"},
                "caKey": {"type": "string"},
                "hosts": {"type": "array", "items": {"type": "string"}},
                "plaintext": {"type": "boolean"},
            }
        ),
        "workerTokenSecret": _closed({"existingSecret": {"type": "string"}}),
        "google": _closed(
            {"credentialsSecret": {"type": "string"}, "credentialsKey": {"type": "string"}}
        ),
        "extraEnv": {"type": "array", "items": env_var},
        "resources": {"type": "object"},
        "podAnnotations": _STRING_MAP,
        "nodeSelector": _STRING_MAP,
        "tolerations": {"type": "array", "items": {"type": "object"}},
        "affinity": {"type": "object"},
    }


def values_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    defs["PoolConfig"] = _hoisted(PoolConfig.model_json_schema(by_alias=True), defs)
    settings = _hoisted(ControlplaneSettings.model_json_schema(by_alias=True), defs)
    pool = {
        "type": "object",
        "if": {"properties": {"provider": {"const": PROVIDER}}, "required": ["provider"]},
        "then": {"$ref": "#/$defs/PoolConfig"},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "levers9-controlplane values",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **chart_properties(),
            "config": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "controlplane": settings,
                    "worker": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "pools": {"type": "object", "additionalProperties": pool},
                        },
                    },
                },
            },
        },
        "$defs": defs,
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_PATH.write_text(render())
    print(SCHEMA_PATH, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
