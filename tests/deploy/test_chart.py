"""The chart, rendered by the real helm: its manifests are valid Kubernetes objects, the values
schema refuses what the controlplane refuses (helm reads values.schema.json), secrets land in a
Secret mounted as a file and nowhere else, and the two files the pod reads load back into the
very pools and settings the values files say."""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from levers9.config import load
from levers9.devstack import values as devvalues
from levers9.gateway.server import SERVICE_NAME
from levers9.rpc import tls
from sandbox.pki import mint_certificate_authority, mint_service_account_key
from tests.deploy.chart import CHART, ROOT, find, helm, refused, render, secret_data, write_json

K8S_VERSION = "1.33.0"
CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = json.dumps(
    mint_service_account_key(project="demo", account="levers9-controlplane", token_uri="https://x")
)
PRIVATE_KEY_LINE = json.loads(KEY)["private_key"].splitlines()[1]
API_KEY = "tmprl-api-key-8b1f0c2e"


@pytest.fixture
def pool_values(tmp_path: Path) -> Path:
    """deploy/eks/values.yaml with the block attach prints pasted under pools."""
    values = yaml.safe_load((ROOT / "deploy" / "eks" / "values.yaml").read_text())
    values["config"]["worker"]["pools"] = {
        devvalues.POOL_NAME: devvalues.pool_block(CA, "https://34.1.2.3")
    }
    values["config"]["controlplane"]["gatewayAdvertisedAddress"] = "203.0.113.7:7443"
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture
def private_values(tmp_path: Path) -> Path:
    """The spec's private values file (the key), plus a Temporal Cloud API key."""
    doc = devvalues.private_block(KEY)
    doc["config"]["controlplane"] = {"temporalApiKey": API_KEY}
    return write_json(tmp_path / "private.json", doc)


def _leaks(doc: Any) -> list[str]:
    text = json.dumps(doc)
    return [s for s in (PRIVATE_KEY_LINE, API_KEY) if s in text]


def test_lint_and_every_manifest_is_a_valid_object(pool_values: Path, private_values: Path) -> None:
    helm("lint", str(CHART), "-f", str(pool_values), "-f", str(private_values), "--strict")
    docs = render([pool_values, private_values])
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Secret",  # the private values
        "Secret",  # the gateway's TLS
        "Secret",  # the worker token secret
        "Service",
        "Service",
        "ServiceAccount",
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_secrets_only_in_the_secret_mounted_as_a_file(
    pool_values: Path, private_values: Path
) -> None:
    docs = render([pool_values, private_values])
    private = find(docs, "Secret", "-private")
    assert [d["metadata"]["name"] for d in docs if _leaks(d)] == [], "secret in plain text"
    plain = secret_data(private, "values.json")
    assert PRIVATE_KEY_LINE in plain
    assert API_KEY in plain
    # Nowhere else, base64 or not: not the ConfigMap, not an env var, not an annotation.
    for doc in docs:
        if doc is private:
            continue
        encoded = json.dumps(doc)
        assert base64.b64encode(KEY.encode()).decode()[:40] not in encoded
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    assert not names & {"LEVERS9_TEMPORAL_API_KEY", "TEMPORAL_API_KEY", "LEVERS9_API_TOKEN"}
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in container["env"])
    volumes = {
        v["name"]: v for v in find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["private"]["secret"]["secretName"] == private["metadata"]["name"]
    assert volumes["private"]["secret"]["defaultMode"] == 0o400


def _materialize(docs: list[dict[str, Any]], root: Path) -> list[Path]:
    """Writes the ConfigMap and Secrets where the pod mounts them (under `root`); returns the
    pod's `--values` arguments mapped there."""
    deployment = find(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            for key, text in objects[("ConfigMap", volume["configMap"]["name"])]["data"].items():
                (target / key).write_text(text)
        elif "secret" in volume and ("Secret", volume["secret"]["secretName"]) in objects:
            secret = objects[("Secret", volume["secret"]["secretName"])]
            for key in secret["data"]:
                (target / key).write_text(secret_data(secret, key))
    args = container["args"]
    paths = [args[i + 1] for i, arg in enumerate(args) if arg == "--values"]
    assert paths, args
    return [root / p.lstrip("/") for p in paths]


def test_the_pod_reads_the_values_as_written(
    pool_values: Path, private_values: Path, tmp_path: Path
) -> None:
    docs = render([pool_values, private_values])
    pod_files = _materialize(docs, tmp_path / "pod")
    direct = load([pool_values, private_values])
    in_pod = load(pod_files)
    assert in_pod.problems == direct.problems == []
    assert in_pod.pools == direct.pools
    assert in_pod.pools[devvalues.POOL_NAME].kubernetes.credentials is not None
    settings = in_pod.settings
    assert settings.temporal_api_key is not None
    assert settings.temporal_api_key.get_secret_value() == API_KEY
    assert settings.gateway_advertised_address == "203.0.113.7:7443"
    assert settings.gateway_listen == "0.0.0.0:7443"
    # The worker token secret the chart generated, read from its mounted file, with its path
    # (not the secret) in the ConfigMap.
    token_file = settings.worker_token_secret_file
    assert token_file is not None
    assert settings.worker_token_secret is None
    secret = (tmp_path / "pod" / str(token_file).lstrip("/")).read_text()
    assert len(secret) == 64
    assert secret not in json.dumps(find(docs, "ConfigMap"))


def test_ports_probes_and_identity_agree_with_the_code(pool_values: Path) -> None:
    docs = render([pool_values], "--set", "gateway.port=7500", "--set", "metrics.port=9100")
    spec = find(docs, "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 7500, "metrics": 9100}
    # TLS by default: the kubelet's gRPC probe speaks none, so a TCP connect; plaintext: gRPC.
    assert container["readinessProbe"]["tcpSocket"] == {"port": 7500}
    plain = render(
        [pool_values], "--set", "gateway.port=7500", "--set", "gatewayTls.plaintext=true"
    )
    probe = find(plain, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert probe["readinessProbe"]["grpc"] == {"port": 7500, "service": SERVICE_NAME}
    env = {e["name"]: e for e in container["env"]}
    assert env["LEVERS9_METRICS_ADDRESS"]["value"] == "0.0.0.0:9100"
    assert env["LEVERS9_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The other replicas relay tunnelled workers' streams through this pod's gateway.
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["LEVERS9_REPLICA_ADDRESS"]["value"] == "$(POD_IP):7500"
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("LEVERS9_REPLICA_ADDRESS"), "$(POD_IP) expands"
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["values.yaml"])
    assert config["config"]["controlplane"]["gatewayListen"] == "0.0.0.0:7500"
    gateway = find(docs, "Service", "-gateway")
    assert gateway["spec"]["ports"] == [
        {"name": "grpc", "port": 7500, "targetPort": "grpc", "protocol": "TCP"}
    ]
    assert (
        gateway["spec"]["selector"] == find(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_temporal_mtls_and_google_identity_are_mounted_files(
    pool_values: Path, tmp_path: Path
) -> None:
    docs = render(
        [pool_values],
        "--set",
        "temporalTls.existingSecret=temporal-client-cert",
        "--set",
        "google.credentialsSecret=levers9-google",
    )
    spec = find(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["temporal-tls"]["secret"]["secretName"] == "temporal-client-cert"
    assert volumes["google"]["secret"]["secretName"] == "levers9-google"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == f"{mounts['google']}/key.json"
    settings = yaml.safe_load(find(docs, "ConfigMap")["data"]["values.yaml"])["config"][
        "controlplane"
    ]
    assert settings["temporalTls"] is True
    for key in ("temporalTlsCertFile", "temporalTlsKeyFile", "temporalTlsServerCaFile"):
        assert settings[key].startswith(mounts["temporal-tls"] + "/"), key


def test_gateway_tls_from_a_secret_of_yours_serves_from_the_mounted_files(
    pool_values: Path, private_values: Path, tmp_path: Path
) -> None:
    docs = render([pool_values, private_values], "--set", "gatewayTls.existingSecret=gw-tls")
    spec = find(docs, "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["gateway-tls"]["secret"]["secretName"] == "gw-tls"
    # The kubelet's gRPC probe speaks no TLS.
    assert container["readinessProbe"]["tcpSocket"] == {"port": 7443}
    assert container["livenessProbe"]["tcpSocket"] == {"port": 7443}
    pod = tmp_path / "pod"
    pod_files = _materialize(docs, pod)
    # The Secret is the user's (cert-manager's layout): written where the pod mounts it.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    authority = mint_certificate_authority("gateway-ca", hosts=("203.0.113.7",))
    mounted = pod / mounts["gateway-tls"].lstrip("/")
    mounted.mkdir(parents=True, exist_ok=True)
    for key, pem in (("tls.crt", authority.cert_pem), ("tls.key", authority.key_pem)):
        (mounted / key).write_bytes(pem)
    (mounted / "ca.crt").write_bytes(authority.ca_pem)
    settings = load(pod_files).settings
    assert settings.gateway_uses_tls()
    in_pod = settings.model_copy(
        update={
            name: pod / str(getattr(settings, name)).lstrip("/")
            for name in ("gateway_tls_cert_file", "gateway_tls_key_file", "gateway_tls_ca_file")
        }
    )
    assert tls.gateway_server_credentials(in_pod) is not None
    assert tls.gateway_ca_pem(in_pod) == authority.ca_pem
    plaintext = render([pool_values], "--set", "gatewayTls.plaintext=true")
    plain = find(plaintext, "Deployment")["spec"]["template"]["spec"]
    assert "grpc" in plain["containers"][0]["readinessProbe"]


def test_the_gateway_speaks_tls_by_default_with_a_certificate_the_chart_makes(
    pool_values: Path,
) -> None:
    """No Secret of yours: a CA and a certificate for the advertised address, generated once
    (kept, and reissued from the same CA when the names change); cert-manager's when it is
    installed; plaintext only when asked for."""
    docs = render([pool_values])
    secret = find(docs, "Secret", "-gateway-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["levers9.dev/hosts"] == "203.0.113.7"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    cert = x509.load_pem_x509_certificate(secret_data(secret, "tls.crt").encode())
    ca = x509.load_pem_x509_certificate(secret_data(secret, "ca.crt").encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["203.0.113.7"]
    cert.verify_directly_issued_by(ca)
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["values.yaml"])
    controlplane = config["config"]["controlplane"]
    assert controlplane["gatewayTlsCertFile"] == "/etc/levers9/gateway-tls/tls.crt"
    assert controlplane["gatewayTlsCaFile"] == "/etc/levers9/gateway-tls/ca.crt"
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "gateway-tls"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert [i["key"] for i in volume["secret"]["items"]] == ["tls.crt", "tls.key", "ca.crt"]
    assert "tcpSocket" in pod["containers"][0]["readinessProbe"]
    # With cert-manager: its Issuers and Certificates, and no key made by the chart.
    managed = render([pool_values], "--api-versions", "cert-manager.io/v1")
    certificate = find(managed, "Certificate", "-gateway")
    assert certificate["spec"]["secretName"] == secret["metadata"]["name"]
    assert certificate["spec"]["ipAddresses"] == ["203.0.113.7"]
    assert not [
        d for d in managed if d["kind"] == "Secret" and "gateway-tls" in d["metadata"]["name"]
    ]
    # Plaintext only when asked.
    plaintext = render([pool_values], "--set", "gatewayTls.plaintext=true")
    assert not [d for d in plaintext if "gateway-tls" in json.dumps(d)]
    error = refused(pool_values, "config.controlplane.gatewayAdvertisedAddress=")
    assert "must name the address workers dial" in error


def test_a_token_secret_in_the_values_replaces_the_generated_one(
    pool_values: Path, tmp_path: Path
) -> None:
    private = write_json(
        tmp_path / "token.json", {"config": {"controlplane": {"workerTokenSecret": "s" * 40}}}
    )
    docs = render([pool_values, private])
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == [
        "levers9-controlplane-gateway-tls",
        "levers9-controlplane-private",
    ]
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["values.yaml"])
    assert "workerTokenSecretFile" not in config["config"]["controlplane"]
    assert "s" * 40 in secret_data(find(docs, "Secret", "-private"), "values.json")


def test_the_gateway_service_takes_its_source_ranges_from_the_values(pool_values: Path) -> None:
    ranges = ["203.0.113.0/24", "198.51.100.7/32"]
    docs = render(
        [pool_values],
        "--set",
        f"gateway.service.loadBalancerSourceRanges={{{','.join(ranges)}}}",
    )
    service = find(docs, "Service", "-gateway")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ranges
    assert (
        "loadBalancerSourceRanges" not in find(render([pool_values]), "Service", "-gateway")["spec"]
    )


def test_the_generated_token_secret_is_made_once_and_an_existing_one_replaces_it(
    pool_values: Path,
) -> None:
    """Generated: a pre-install hook (no upgrade or later render makes it again) kept across
    uninstall; `workerTokenSecret.existingSecret` (GitOps): none generated, that one mounted."""
    docs = render([pool_values])
    generated = find(docs, "Secret", "-worker-token")
    assert generated["metadata"]["annotations"] == {
        "helm.sh/hook": "pre-install",
        "helm.sh/hook-weight": "-10",
        "helm.sh/resource-policy": "keep",
    }
    docs = render([pool_values], "--set", "workerTokenSecret.existingSecret=ops-worker-token")
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == [
        "levers9-controlplane-gateway-tls",
        "levers9-controlplane-private",
    ]
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    [token] = [v for v in volumes if v["name"] == "worker-token"]
    assert token["secret"]["secretName"] == "ops-worker-token"
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["values.yaml"])
    assert config["config"]["controlplane"]["workerTokenSecretFile"] == (
        "/etc/levers9/worker-token/secret"
    )


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("config.worker.pools.gke-rtx6000.kubernetes.flavour=gke", "Additional property flavour"),
        ("config.worker.pools.gke-rtx6000.kubernetes.flavor=eks", "kubernetes.flavor"),
        ("config.controlplane.temporalAdress=x:7233", "Additional property temporalAdress"),
        ("replicaCount=two", "replicaCount"),
        ("imag.tag=1", "Additional property imag"),
        ("extraEnv[0].name=TEMPORAL_API_KEY", "extraEnv.0.name"),
        ("gateway.service.type=Ingress", "gateway.service.type"),
    ],
)
def test_the_schema_refuses_bad_values_naming_the_field(
    pool_values: Path, setting: str, named: str
) -> None:
    error = refused(pool_values, setting)
    assert "don't meet the specifications of the schema" in error
    assert named in error, error


def test_gateway_listen_must_use_the_gateway_port(pool_values: Path) -> None:
    error = refused(pool_values, "config.controlplane.gatewayListen=0.0.0.0:9999")
    assert (
        "config.controlplane.gatewayListen 0.0.0.0:9999 must listen on gateway.port (7443)" in error
    )


def test_chart_version_is_the_controlplanes() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["version"] == chart["appVersion"] == project["version"]
