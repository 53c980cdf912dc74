"""The environment contract: required variables are named when missing, and the advertised
address is the node's external IP, else its host IP, never a name (`dial tcp: lookup <node>`)."""

from __future__ import annotations

import pytest

from levers9.agent.settings import SettingsError, WorkerSettings
from tests.agent.kit import TOKEN
from tests.factories import worker_tls

BASE = {
    "LEVERS9_GATEWAY_ADDRESS": "127.0.0.1:7443",
    "LEVERS9_POOL_NAME": "gke-rtx6000",
    "LEVERS9_WORKER_ID": "w1",
    "LEVERS9_WORKER_TOKEN": TOKEN,
    "LEVERS9_NODE_NAME": "gke-node-1",
}


def test_missing_variables_are_named() -> None:
    with pytest.raises(SettingsError) as raised:
        WorkerSettings.from_env({"LEVERS9_POOL_NAME": "p", "LEVERS9_WORKER_PORT": "x"})
    message = str(raised.value)
    for name in ("LEVERS9_GATEWAY_ADDRESS", "LEVERS9_WORKER_TOKEN", "LEVERS9_WORKER_PORT"):
        assert name in message
    assert TOKEN not in message


@pytest.mark.parametrize(
    ("extra", "advertised"),
    [
        ({"LEVERS9_ADVERTISED_HOST": "127.0.20.2", "LEVERS9_HOST_IP": "127.0.10.2"}, "127.0.20.2"),
        ({"LEVERS9_HOST_IP": "127.0.10.2"}, "127.0.10.2"),
    ],
)
def test_the_external_ip_is_advertised_first(extra: dict[str, str], advertised: str) -> None:
    assert WorkerSettings.from_env({**BASE, **extra}).address_to_advertise() == advertised


def test_a_node_name_is_never_advertised() -> None:
    settings = WorkerSettings.from_env({**BASE, "LEVERS9_ADVERTISED_HOST": "gke-node-1"})
    with pytest.raises(SettingsError, match="dial tcp: lookup"):
        settings.address_to_advertise()


def test_no_address_at_all_is_an_error() -> None:
    with pytest.raises(SettingsError, match="LEVERS9_ADVERTISED_HOST"):
        WorkerSettings.from_env(BASE).address_to_advertise()


def test_the_token_stays_out_of_reprs() -> None:
    assert TOKEN not in repr(WorkerSettings.from_env(BASE))


def test_serving_tls_from_the_secret_and_never_in_tunnel_mode() -> None:
    cert, key = worker_tls("w1")
    tls_env = {**BASE, "LEVERS9_WORKER_TLS_CERT": cert, "LEVERS9_WORKER_TLS_KEY": key}
    settings = WorkerSettings.from_env(tls_env)
    assert settings.worker_credentials() is not None
    assert key not in repr(settings)
    assert WorkerSettings.from_env(BASE).worker_credentials() is None, "an older Job: plaintext"
    tunnelled = WorkerSettings.from_env({**tls_env, "LEVERS9_TUNNEL": "true"})
    assert tunnelled.worker_credentials() is None


def test_a_broken_serving_certificate_names_the_variable() -> None:
    cert, _ = worker_tls("w1")
    _, other_key = worker_tls("w1")
    settings = WorkerSettings.from_env(
        {**BASE, "LEVERS9_WORKER_TLS_CERT": cert, "LEVERS9_WORKER_TLS_KEY": other_key}
    )
    with pytest.raises(SettingsError, match="LEVERS9_WORKER_TLS_KEY: the key does not belong"):
        settings.worker_credentials()
    only_cert = WorkerSettings.from_env({**BASE, "LEVERS9_WORKER_TLS_CERT": cert})
    with pytest.raises(SettingsError, match="LEVERS9_WORKER_TLS_KEY is not set"):
        only_cert.worker_credentials()
