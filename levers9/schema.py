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
        "properties": {
            "config": {
                "type": "object",
                "properties": {
                    "controlplane": settings,
                    "worker": {
                        "type": "object",
                        "properties": {
                            "pools": {"type": "object", "additionalProperties": pool},
                        },
                    },
                },
            }
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
