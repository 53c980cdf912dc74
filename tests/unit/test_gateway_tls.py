"""The gateway's TLS settings fail at start, naming the setting: a certificate without its key,
a file that is missing or not PEM, a key that belongs to another certificate, a worker CA that is
not a certificate. The controlplane's own start refuses them (exit 2) before it serves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.config import ControlplaneSettings
from levers9.rpc import tls
from sandbox import pki
from tests.factories import values_doc, write_yaml

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def authority() -> pki.CertificateAuthority:
    return pki.mint_certificate_authority("levers9-gateway-ca", hosts=("127.0.0.1",))


def _files(directory: Path, cert: bytes, key: bytes, ca: bytes) -> dict[str, str]:
    paths = {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
    for name, pem in paths.items():
        (directory / name).write_bytes(pem)
    return {
        "gatewayTlsCertFile": str(directory / "tls.crt"),
        "gatewayTlsKeyFile": str(directory / "tls.key"),
        "gatewayTlsCaFile": str(directory / "ca.crt"),
    }


def test_plaintext_unless_asked() -> None:
    settings = ControlplaneSettings.model_validate({})
    assert not settings.gateway_uses_tls()
    assert tls.gateway_client_credentials(settings) is None
    assert tls.gateway_server_credentials(settings) is None


def test_a_ca_file_alone_is_a_client_of_a_tls_gateway(
    tmp_path: Path, authority: pki.CertificateAuthority
) -> None:
    (tmp_path / "ca.crt").write_bytes(authority.ca_pem)
    settings = ControlplaneSettings.model_validate({"gatewayTlsCaFile": str(tmp_path / "ca.crt")})
    assert settings.gateway_uses_tls()
    assert tls.gateway_client_credentials(settings) is not None
    assert tls.gateway_server_credentials(settings) is None


def test_a_certificate_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="gatewayTlsCertFile and gatewayTlsKeyFile go"):
        ControlplaneSettings.model_validate({"gatewayTlsCertFile": str(tmp_path / "tls.crt")})


def test_matching_files_serve(tmp_path: Path, authority: pki.CertificateAuthority) -> None:
    files = _files(tmp_path, authority.cert_pem, authority.key_pem, authority.ca_pem)
    settings = ControlplaneSettings.model_validate(files)
    assert tls.gateway_server_credentials(settings) is not None
    assert tls.gateway_ca_pem(settings) == authority.ca_pem


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        ("missing", "gatewayTlsCertFile: cannot read .*tls.crt: No such file or directory"),
        ("cert-not-pem", r"gatewayTlsCertFile: not a PEM certificate"),
        ("key-not-pem", r"gatewayTlsKeyFile: not an unencrypted PEM private key"),
        ("other-key", "gatewayTlsKeyFile: the key does not belong to gatewayTlsCertFile's"),
        ("ca-not-pem", r"gatewayTlsCaFile: not a PEM certificate"),
    ],
)
def test_a_broken_file_names_its_setting(
    tmp_path: Path, authority: pki.CertificateAuthority, broken: str, expected: str
) -> None:
    other = pki.mint_certificate_authority("other", hosts=("127.0.0.1",))
    cert, key, ca = authority.cert_pem, authority.key_pem, authority.ca_pem
    if broken == "cert-not-pem":
        cert = b"not a certificate"
    elif broken == "key-not-pem":
        key = cert
    elif broken == "other-key":
        key = other.key_pem
    elif broken == "ca-not-pem":
        ca = authority.key_pem
    files = _files(tmp_path, cert, key, ca)
    if broken == "missing":
        Path(files["gatewayTlsCertFile"]).unlink()
    settings = ControlplaneSettings.model_validate(files)
    with pytest.raises(tls.TlsError, match=expected) as caught:
        tls.check_gateway_settings(settings)
    assert "-----BEGIN PRIVATE KEY-----\n" not in str(caught.value), "no key material in errors"


def _worker_env(**extra: str) -> dict[str, str]:
    return {
        "LEVERS9_GATEWAY_ADDRESS": "127.0.0.1:7443",
        "LEVERS9_POOL_NAME": "gke-rtx6000",
        "LEVERS9_WORKER_ID": "w1",
        "LEVERS9_WORKER_TOKEN": "l9w1.token",
        **extra,
    }


def test_the_worker_dials_tls_when_its_job_says_so(authority: pki.CertificateAuthority) -> None:
    assert WorkerSettings.from_env(_worker_env()).gateway_credentials() is None
    on = WorkerSettings.from_env(_worker_env(LEVERS9_GATEWAY_TLS="true"))
    assert on.gateway_credentials() is not None
    with_ca = WorkerSettings.from_env(_worker_env(LEVERS9_GATEWAY_CA=authority.ca_pem.decode()))
    assert with_ca.gateway_credentials() is not None
    broken = WorkerSettings.from_env(_worker_env(LEVERS9_GATEWAY_CA="garbage"))
    with pytest.raises(SettingsError, match="LEVERS9_GATEWAY_CA: not a PEM certificate"):
        broken.gateway_credentials()


def test_the_controlplane_refuses_to_start_with_a_key_of_another_cert(
    tmp_path: Path, authority: pki.CertificateAuthority
) -> None:
    other = pki.mint_certificate_authority("other", hosts=("127.0.0.1",))
    files = _files(tmp_path, authority.cert_pem, other.key_pem, authority.ca_pem)
    values = write_yaml(
        tmp_path / "values.yaml",
        values_doc({}, {"workerTokenSecret": "s3cret-marker", **files}),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "worker_main.py"), "-f", str(values)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "invalid values" in out
    assert "the key does not belong to gatewayTlsCertFile's certificate" in out
    assert "s3cret-marker" not in out
