"""Values a new user got wrong are refused, naming the field (or the file and line) and the fix:
a key written twice in one map, a key above the pools that nothing reads (`config.wrker`), a
node selector Kubernetes would refuse (in values and in `cluster join --node-selector`), a pool
block with no provider, a document nested thousands deep; a quantity written as a number
(`memory: 8`) is read as Kubernetes reads it, but a task's memory below the 6 MiB floor, or an
exponent no node has (`1e999999999`, which took forever to compute), is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from levers9.config import INVALID_PROVIDER, MAX_DEPTH, ConfigError, load, parse_values
from tests.factories import key_json, spec_pool, values_doc, write_yaml

POOL = "config.worker.pools.gke-rtx6000"


def _errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load([path])
    return caught.value.errors


def _problems(block: Any) -> list[str]:
    values = parse_values(values_doc({"gke-rtx6000": block}))
    return [p.error for p in values.problems]


def test_a_pool_written_twice_names_the_key_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        "config:\n"
        "  worker:\n"
        "    pools:\n"
        "      gke-rtx6000:\n"
        "        provider: kubernetes\n"
        "      gke-rtx6000:\n"
        "        provider: kubernetes\n"
    )
    assert _errors(path) == [
        f"{path}: key 'gke-rtx6000' is written twice in one map (lines 4 and 6): keep one"
        " (YAML keeps no duplicate; the last would win)"
    ]


def test_a_key_twice_in_a_flow_map_or_deeper_is_refused_too(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("config: {worker: {pools: {}}, worker: {}}\n")
    assert "key 'worker' is written twice in one map (lines 1 and 1)" in _errors(flow)[0]
    deeper = tmp_path / "deeper.json"
    deeper.write_text('{"config": {"controlplane": {"taskQueue": "a", "taskQueue": "b"}}}')
    assert "key 'taskQueue' is written twice" in _errors(deeper)[0]


def test_a_merge_key_and_the_keys_beside_it_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        "defaults: &d {taskQueue: a, reconcileIntervalSeconds: 5}\n"
        "config:\n"
        "  controlplane:\n"
        "    <<: *d\n"
        "    taskQueue: b\n"
    )
    assert load([path]).settings.task_queue == "b"


@pytest.mark.parametrize(
    ("doc", "line"),
    [
        (
            {"config": {"wrker": {"pools": {}}}},
            "config.wrker: unknown field (check its spelling against docs/configuration.md;"
            " config holds controlplane, worker)",
        ),
        (
            {"config": {"worker": {"pool": {}}}},
            "config.worker.pool: unknown field (check its spelling against"
            " docs/configuration.md; config.worker holds pools)",
        ),
    ],
)
def test_an_unknown_key_above_the_pools_is_refused_naming_its_path(
    doc: dict[str, Any], line: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_values(doc)
    assert caught.value.errors == [line]


def test_the_charts_own_keys_beside_config_pass() -> None:
    doc = {"replicaCount": 2, "image": {"tag": "x"}, **values_doc({})}
    assert parse_values(doc).problems == []


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ({"k": "v=w"}, "label k: its value 'v=w' is not at most 63 of"),
        ({"bad key": "x"}, "label key 'bad key': its name 'bad key' is not"),
        ({"k": "x" * 64}, "label k: its value 'xxxx"),
        ({"Example.COM/gpu": "x"}, "label key 'Example.COM/gpu': its prefix 'Example.COM' is"),
        ({"-k": "x"}, "label key '-k': its name '-k' is not"),
    ],
)
def test_a_node_selector_kubernetes_would_refuse_is_refused(
    selector: dict[str, str], problem: str
) -> None:
    [error] = _problems(spec_pool(credentials=key_json(), nodeSelector=selector))
    assert error.startswith(f"{POOL}.kubernetes.nodeSelector: {problem}"), error


def test_the_selectors_kubernetes_takes_pass() -> None:
    selector = {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000", "tier": "", "a_b.C": "1"}
    assert _problems(spec_pool(credentials=key_json(), nodeSelector=selector)) == []


def test_cluster_join_refuses_a_node_selector_kubernetes_would_refuse(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(str(Path(sys.executable).parent / "levers9"), "cluster", "join", "--name", "j1"),
            *("--gpu-type", "L4", "--node-selector", "k=v=w", "--worker-image", "x"),
        ],
        env={**os.environ, "LEVERS9_HOME": str(tmp_path), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Invalid value for --node-selector: label k: its value 'v=w'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("block", "lines"),
    [
        ({}, [INVALID_PROVIDER, f"{POOL}.provider: required: write provider: kubernetes"]),
        (42, [f"{POOL}: must be a map"]),
        ({"mode": "external"}, [INVALID_PROVIDER, f"{POOL}.provider: required: write provider:"]),
    ],
)
def test_a_pool_block_without_a_provider_names_its_path(block: Any, lines: list[str]) -> None:
    errors = _problems(block)
    assert len(errors) == len(lines)
    assert all(error.startswith(line) for error, line in zip(errors, lines, strict=True)), errors


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_a_document_nested_thousands_deep_is_refused_cleanly(tmp_path: Path, opening: str) -> None:
    path = tmp_path / "deep.yaml"
    closing = {"[": "]", "{a: ": "}", "- ": ""}[opening]
    if opening == "- ":
        path.write_text("".join("  " * i + "-\n" for i in range(5000)))
    else:
        path.write_text(opening * 5000 + "1" + closing * 5000)
    assert _errors(path) == [
        f"{path}: nested more than {MAX_DEPTH} deep: values are a few maps deep (config: worker:"
        " pools: <name>: ...)"
    ]


def test_deep_credentials_are_refused_as_credentials_not_a_recursion() -> None:
    block = spec_pool(flavor="generic", credentials="{" * 5000 + "}" * 5000)
    block["kubernetes"].pop("caCertificate")
    assert _problems(block) == [
        f"{POOL}.kubernetes: for flavor generic, credentials is a bearer token (one line) or a"
        " kubeconfig (kind: Config)"
    ]


def test_quantities_written_as_numbers_read_as_kubernetes_reads_them(tmp_path: Path) -> None:
    block = spec_pool(credentials=key_json())
    block["workerResources"] = {"memory": 8 * 2**30, "cpu": 0.5}
    block["taskDefaults"] = {"memory": 8 * 2**30, "cpus": 4}
    block["imageCacheSize"] = 10**12
    values = load([write_yaml(tmp_path / "values.yaml", values_doc({"gke-rtx6000": block}))])
    assert values.problems == []
    pool = values.pools["gke-rtx6000"]
    assert pool.worker_resources.memory_bytes == 8 * 2**30
    assert pool.worker_resources.cpu_millis == 500
    assert pool.task_defaults.memory_bytes == 8 * 2**30
    assert pool.task_defaults.cpu_millis == 4000
    assert pool.image_cache_bytes == 10**12
    block["workerResources"] = {"memory": 8}
    assert _problems(json.loads(json.dumps(block))) == []  # 8 bytes, as Kubernetes reads it
    block["workerResources"] = {"memory": True}
    [error] = _problems(block)
    assert error.startswith(f"{POOL}.workerResources.memory:"), error


def test_a_task_memory_below_the_floor_is_refused_naming_the_fix() -> None:
    block = spec_pool(credentials=key_json())
    block["taskDefaults"] = {"memory": 8}
    assert _problems(block) == [
        f"{POOL}.taskDefaults.memory: 8 bytes is below the 6Mi a container needs to start (a"
        " bare number is bytes): write a unit, e.g. 512Mi or 8Gi"
    ]
    block["taskDefaults"] = {"memory": "6Mi"}
    assert _problems(block) == []


def test_a_quantity_with_an_exponent_no_node_has_is_refused_at_once() -> None:
    block = spec_pool(credentials=key_json())
    block["imageCacheSize"] = "1e999999999"
    [error] = _problems(block)
    assert error == (
        f"{POOL}.imageCacheSize: '1e999999999': an exponent past e30 is no resource any node has"
        " (e.g. 500m, 2, 1Gi)"
    )
