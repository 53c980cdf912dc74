"""The values block: the spec's block parses, bad input names its field, secrets never leak,
values files merge like `helm -f a -f b`, controlplane settings come from values or environment.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from levers9 import logs
from levers9.config import (
    INVALID_PROVIDER,
    ConfigError,
    load,
    merge_values,
    parse_pool,
    parse_settings,
    parse_values,
)
from tests.factories import (
    MARKER,
    key_json,
    private_values,
    spec_pool,
    values_doc,
    write_json,
    write_yaml,
)

PREFIX = "config.worker.pools.gke-rtx6000"


def _pool_errors(block: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_pool("gke-rtx6000", block)
    return caught.value.errors


def test_spec_block_with_private_file_parses(tmp_path: Path) -> None:
    values = load(
        [
            write_yaml(tmp_path / "values.yaml", values_doc({"gke-rtx6000": spec_pool()})),
            write_json(tmp_path / "private.json", private_values()),
        ]
    )
    pool = values.pools["gke-rtx6000"]
    assert values.problems == []
    assert pool.mode == "external"
    assert pool.gpu_type == "RTXPro6000"
    assert pool.host_network is True
    assert pool.cache.enabled is False
    assert pool.kubernetes.flavor == "gke"
    assert pool.kubernetes.namespace == "levers9"
    assert pool.kubernetes.tunnel is False
    assert pool.kubernetes.node_selector == {
        "cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"
    }
    secret = pool.kubernetes.resolved_credentials()
    assert secret is not None
    assert json.loads(secret.get_secret_value())["type"] == "service_account"


def test_credentials_file_is_read(tmp_path: Path) -> None:
    key = tmp_path / "gke-sa.json"
    key.write_text(key_json())
    pool = parse_pool("gke-rtx6000", spec_pool(credentialsFile=str(key)))
    secret = pool.kubernetes.resolved_credentials()
    assert secret is not None
    assert secret.get_secret_value() == key_json()


NOT_A_CERT = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnope\n").decode()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"caCertificate": NOT_A_CERT},
            f"{PREFIX}.kubernetes.caCertificate: not a base64 PEM certificate",
        ),
        (
            {"caCertificate": "%%% not base64 %%%"},
            f"{PREFIX}.kubernetes.caCertificate: not a base64 PEM certificate",
        ),
        ({"endpoint": "http://34.118.0.10"}, f"{PREFIX}.kubernetes.endpoint: must be an https://"),
        ({"endpoint": "34.118.0.10"}, f"{PREFIX}.kubernetes.endpoint: must be an https://"),
        ({"namespace": "Levers_9"}, f"{PREFIX}.kubernetes.namespace: 'Levers_9' is not a valid"),
        ({"flavor": "eks"}, f"{PREFIX}.kubernetes.flavor: Input should be 'gke' or 'generic'"),
        ({"workerImage": "a b"}, f"{PREFIX}.kubernetes.workerImage: an image reference"),
        ({"nodeSelecter": {"a": "b"}}, f"{PREFIX}.kubernetes.nodeSelecter: unknown field"),
        ({}, f"{PREFIX}.kubernetes: flavor gke needs credentials"),
        (
            {"credentials": key_json(), "credentialsFile": "/tmp/k.json"},
            f"{PREFIX}.kubernetes: set either credentials or credentialsFile, not both",
        ),
        (
            {"credentials": json.dumps({"type": "authorized_user", "marker": MARKER})},
            f"{PREFIX}.kubernetes: not a service-account key",
        ),
        (
            {"credentials": f"just a token {MARKER}"},
            f"{PREFIX}.kubernetes: not a service-account key",
        ),
        (
            {"credentialsFile": "/nonexistent/levers9/gke-sa.json"},
            f"{PREFIX}.kubernetes: credentialsFile: cannot read /nonexistent/levers9/gke-sa.json",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(v) or "none",
)
def test_bad_kubernetes_block_names_the_field(change: dict[str, Any], expected: str) -> None:
    errors = _pool_errors(spec_pool(**change))
    assert any(line.startswith(expected) for line in errors), errors
    assert all(MARKER not in line for line in errors)


def test_unreadable_credentials_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = tmp_path  # root reads any file; a directory still cannot be read as one
    else:
        target = tmp_path / "key.json"
        target.write_text(key_json())
        target.chmod(0)
    errors = _pool_errors(spec_pool(credentialsFile=str(target)))
    assert errors == [
        f"{PREFIX}.kubernetes: credentialsFile: cannot read {target}: "
        + ("Is a directory" if target.is_dir() else "Permission denied")
    ]


def test_host_network_false_needs_tunnel() -> None:
    block = spec_pool(credentials=key_json())
    block["hostNetwork"] = False
    [error] = _pool_errors(block)
    assert error.startswith(f"{PREFIX}: hostNetwork: false needs kubernetes.tunnel: true")
    assert "nothing outside the cluster can dial a pod address" in error
    block["kubernetes"]["tunnel"] = True
    assert parse_pool("gke-rtx6000", block).host_network is False


def test_runtime_defaults_to_runc_and_takes_runsc() -> None:
    block = spec_pool(credentials=key_json())
    assert parse_pool("gke-rtx6000", block).runtime == "runc"
    block["runtime"] = "runsc"
    assert parse_pool("gke-rtx6000", block).runtime == "runsc"


PROCESS_REFUSED = (
    "process runs tasks as processes of the worker, outside any sandbox: it is the agent's own"
    " tests' runtime, never a pool's; use runc or runsc"
)


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ("kata", "unknown runtime 'kata': use one of runc, runsc"),
        ("", "unknown runtime '': use one of runc, runsc"),
        ("process", PROCESS_REFUSED),
    ],
)
def test_a_runtime_that_is_not_built_is_refused_naming_the_field(
    runtime: str, expected: str
) -> None:
    block = spec_pool(credentials=key_json())
    block["runtime"] = runtime
    [error] = _pool_errors(block)
    assert error.startswith(f"{PREFIX}.runtime: {expected}"), error


def test_runtimes_offers_more_than_the_runtime_and_holds_it() -> None:
    block = spec_pool(credentials=key_json())
    assert parse_pool("gke-rtx6000", block).offered_runtimes == ("runc",)
    block["runtimes"] = ["runsc", "runc"]
    assert parse_pool("gke-rtx6000", block).offered_runtimes == ("runc", "runsc")


@pytest.mark.parametrize(
    ("runtimes", "expected"),
    [
        (["runc", "kata"], ".runtimes: unknown runtime 'kata': use one of runc, runsc"),
        (["runc", "process"], f".runtimes: {PROCESS_REFUSED}"),
        ([], ".runtimes: empty: list the runtimes tasks may name (runc, runsc), or unset it"),
        (["runc", "runsc", "runc"], ".runtimes: runc listed twice"),
        (
            ["runsc"],
            ": runtimes: [runsc] does not hold runtime runc (what a task that names none runs"
            " in): add runc to runtimes, or set runtime to one of them",
        ),
    ],
)
def test_a_wrong_runtimes_is_refused_naming_the_field(runtimes: list[str], expected: str) -> None:
    block = spec_pool(credentials=key_json())
    block["runtimes"] = runtimes
    [error] = _pool_errors(block)
    assert error.startswith(f"{PREFIX}{expected}"), error


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("imagesPath", "var/lib/levers9", f"{PREFIX}.imagesPath: must be an absolute path"),
        ("mode", "internal", f"{PREFIX}.mode: Input should be 'external'"),
        ("gpuType", "", f"{PREFIX}.gpuType: String should have at least 1 character"),
    ],
)
def test_bad_pool_field(field: str, value: object, expected: str) -> None:
    block = spec_pool(credentials=key_json())
    block[field] = value
    errors = _pool_errors(block)
    assert any(line.startswith(expected) for line in errors), errors


def test_missing_field_is_required() -> None:
    block = spec_pool(credentials=key_json())
    del block["kubernetes"]["workerImage"]
    assert _pool_errors(block) == [f"{PREFIX}.kubernetes.workerImage: required"]


def test_generic_flavor_takes_a_token_or_kubeconfig_or_nothing() -> None:
    for credentials in ("a-bearer-token", "apiVersion: v1\nkind: Config\nclusters: []\n", None):
        change: dict[str, Any] = {"flavor": "generic", "caCertificate": None}
        if credentials:
            change["credentials"] = credentials
        assert parse_pool("any-k8s", spec_pool(**change)).kubernetes.flavor == "generic"
    with pytest.raises(ConfigError, match=r"bearer token .one line. or a kubeconfig"):
        parse_pool("any-k8s", spec_pool(flavor="generic", credentials="two\nlines"))


def test_invalid_provider_skips_only_that_pool(caplog: pytest.LogCaptureFixture) -> None:
    values = parse_values(
        values_doc(
            {
                "gke-rtx6000": spec_pool(credentials=key_json()),
                "old-aws": {"mode": "external", "provider": "aws-batch"},
            }
        )
    )
    assert list(values.pools) == ["gke-rtx6000"]
    assert [(p.pool_name, p.error) for p in values.problems] == [("old-aws", INVALID_PROVIDER)]


def test_a_private_file_naming_another_pool_says_so(tmp_path: Path) -> None:
    """The spec's `invalid provider name`, then why: the key's pool name is not the block's."""
    public = write_yaml(tmp_path / "values.yaml", values_doc({"gke-rtx6000": spec_pool()}))
    private = write_json(tmp_path / "private.json", private_values("gke-rtx600"))  # a typo
    values = load([public, private])
    assert [(p.pool_name, p.error) for p in values.problems] == [
        (
            "gke-rtx6000",
            f"{PREFIX}.kubernetes: flavor gke needs credentials (the service-account key, from a"
            " private values file) or credentialsFile",
        ),
        ("gke-rtx600", INVALID_PROVIDER),
        (
            "gke-rtx600",
            "config.worker.pools.gke-rtx600: only credentials here: a private values file names"
            " a pool the other values files do not have (check the pool's name in both)",
        ),
    ]
    assert MARKER not in str(values.problems)


def test_bad_pool_name_and_shape() -> None:
    values = parse_values(values_doc({"GKE_pool": spec_pool(), "flat": "not a map"}))
    assert not values.pools
    assert [p.error for p in values.problems] == [
        "config.worker.pools.GKE_pool: a pool name is lowercase letters, digits and '-',"
        " at most 40 long",
        "config.worker.pools.flat: must be a map",
    ]


def test_pools_must_be_a_map() -> None:
    with pytest.raises(ConfigError, match=r"config\.worker\.pools: must be a map"):
        parse_values({"config": {"worker": {"pools": ["a"]}}})


def test_unreadable_and_malformed_values_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read: No such file"):
        load([tmp_path / "missing.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML or JSON \(line 2"):
        load([bad])
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(ConfigError, match="the top level must be a map"):
        load([scalar])


def test_merge_like_helm() -> None:
    base: dict[str, Any] = {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "keep": True}
    override = {"a": {"c": [3], "d": {"f": 2}, "b": None}, "new": "x"}
    assert merge_values(base, override) == {
        "a": {"c": [3], "d": {"e": 1, "f": 2}},
        "keep": True,
        "new": "x",
    }
    assert base["a"]["b"] == 1  # inputs are not modified


def test_later_file_wins(tmp_path: Path) -> None:
    first = write_yaml(tmp_path / "a.yaml", values_doc({"gke-rtx6000": spec_pool()}))
    second = write_json(
        tmp_path / "b.json",
        values_doc({"gke-rtx6000": {"gpuType": "H100", "kubernetes": {"credentials": key_json()}}}),
    )
    assert load([first, second]).pools["gke-rtx6000"].gpu_type == "H100"
    assert load([second, first]).pools["gke-rtx6000"].gpu_type == "RTXPro6000"


def test_settings_defaults_values_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("LEVERS9_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    defaults = parse_settings({})
    assert defaults.reconcile_interval_seconds == 15
    assert defaults.worker_idle_minutes == 5
    assert defaults.worker_record_ttl_minutes == 10
    assert defaults.temporal_address == "127.0.0.1:7233"
    doc = {"config": {"controlplane": {"temporalAddress": "temporal:7233", "taskQueue": "cp"}}}
    assert parse_settings(doc).temporal_address == "temporal:7233"
    monkeypatch.setenv("TEMPORAL_ADDRESS", "ns.tmprl.cloud:7233")
    monkeypatch.setenv("TEMPORAL_API_KEY", MARKER)
    monkeypatch.setenv("LEVERS9_RECONCILE_INTERVAL_SECONDS", "3")
    settings = parse_settings(doc)
    assert settings.temporal_address == "ns.tmprl.cloud:7233"
    assert settings.task_queue == "cp"
    assert settings.reconcile_interval_seconds == 3
    assert MARKER not in repr(settings)
    assert MARKER not in settings.model_dump_json()


def test_bad_settings_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEVERS9_RECONCILE_INTERVAL_SECONDS", raising=False)
    with pytest.raises(ConfigError) as caught:
        parse_settings(
            {"config": {"controlplane": {"reconcileIntervalSeconds": 0, "bogus": MARKER}}}
        )
    assert caught.value.errors == [
        "config.controlplane.reconcileIntervalSeconds: Input should be greater than 0",
        "config.controlplane.bogus: unknown field (check its spelling against"
        " docs/configuration.md)",
    ]
    assert MARKER not in str(caught.value)


ENDPOINTS_FRONT = {
    "endpointsIdleTimeoutSeconds": (
        "endpoints_idle_timeout_seconds", "LEVERS9_ENDPOINTS_IDLE_TIMEOUT_SECONDS", 75, 620
    ),
    "endpointsHeaderTimeoutSeconds": (
        "endpoints_header_timeout_seconds", "LEVERS9_ENDPOINTS_HEADER_TIMEOUT_SECONDS", 20, 5
    ),
    "endpointsMaxBodyBytes": (
        "endpoints_max_body_bytes", "LEVERS9_ENDPOINTS_MAX_BODY_BYTES", 100 * 1024 * 1024, 1024
    ),
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(ENDPOINTS_FRONT))
def test_the_endpoints_front_limits_default_set_and_refuse_zero_or_less(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    field, env, default, other = ENDPOINTS_FRONT[key]
    monkeypatch.delenv(env, raising=False)
    assert getattr(parse_settings({}), field) == default
    assert getattr(parse_settings({"config": {"controlplane": {key: other}}}), field) == other
    monkeypatch.setenv(env, str(other + 1))
    assert getattr(parse_settings({}), field) == other + 1
    monkeypatch.delenv(env)
    for bad in (0, -1):
        with pytest.raises(ConfigError) as caught:
            parse_settings({"config": {"controlplane": {key: bad}}})
        assert caught.value.errors == [f"config.controlplane.{key}: Input should be greater than 0"]


def test_marker_secret_never_leaks(tmp_path: Path) -> None:
    values = load(
        [
            write_yaml(tmp_path / "values.yaml", values_doc({"gke-rtx6000": spec_pool()})),
            write_json(tmp_path / "private.json", private_values()),
        ]
    )
    pool = values.pools["gke-rtx6000"]
    rendered = [
        repr(values),
        str(pool),
        repr(pool.kubernetes),
        pool.model_dump_json(),
        json.dumps(pool.model_dump(mode="json")),
        logs.format_line("pool", {"credentials": pool.kubernetes.credentials}),
    ]
    for text in rendered:
        assert MARKER not in text
    assert "**********" in str(pool)


def test_marker_secret_not_in_validation_errors_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    block = spec_pool(credentials={"not": "a string", "m": MARKER})
    errors = _pool_errors(block)
    assert errors == [f"{PREFIX}.kubernetes.credentials: Input should be a valid string"]
    with caplog.at_level(logging.INFO):
        logging.getLogger("levers9.test").error("x", extra={logs.KV_EXTRA: {"e": errors}})
    assert MARKER not in caplog.text


def test_task_defaults_parse_and_bad_ones_name_their_field() -> None:
    block = spec_pool(credentials=key_json())
    block["taskDefaults"] = {
        "image": "us-docker.pkg.dev/p/r/torch:2.5",
        "memory": "8Gi",
        "cpus": "4",
    }
    defaults = parse_pool("gke-rtx6000", block).task_defaults
    assert (defaults.image, defaults.memory_bytes, defaults.cpu_millis) == (
        "us-docker.pkg.dev/p/r/torch:2.5",
        8 * 2**30,
        4000,
    )
    plain = parse_pool("gke-rtx6000", spec_pool(credentials=key_json()))
    assert plain.task_defaults.image is None
    assert plain.image_cache_bytes == 100 * 2**30, "imageCacheSize's default"
    for bad, field in (
        ({"image": "Not An Image"}, "taskDefaults.image"),
        ({"memory": "lots"}, "taskDefaults.memory"),
        ({"cpus": "0"}, "taskDefaults.cpus"),
        ({"gpus": 2}, "taskDefaults.gpus"),
    ):
        block = spec_pool(credentials=key_json())
        block["taskDefaults"] = bad
        errors = _pool_errors(block)
        assert any(e.startswith(f"{PREFIX}.{field}") for e in errors), errors
    for size in ("0", "big"):
        block = spec_pool(credentials=key_json())
        block["imageCacheSize"] = size
        errors = _pool_errors(block)
        assert any(e.startswith(f"{PREFIX}.imageCacheSize") for e in errors), errors
