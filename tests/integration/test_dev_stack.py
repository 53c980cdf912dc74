"""`levers9 dev up/status/down` as a user drives them: up starts the sandbox cluster, the
Temporal dev server and the Temporal worker on the dev values and writes a sourceable env file
that kubectl and temporal both use; the dev pool's key authenticates to the sandbox as GKE's
would; scenario commands change the cluster; a second up changes nothing; a taken port is named
with who holds it; down leaves no process behind and a restart keeps the sandbox's trust; the
dev key never reaches a log.

The cloud around it: up starts the two registries (ECR's and Artifact Registry's stand-ins) with
the worker image in the first, moto seeded with the EKS controlplane whose first node's public IP
is the sandbox's egress IP, and the GCP APIs; the egress IP is not on the authorized networks, so
reconcile reports the spec's 403, until `attach-gke-pool.sh` (run from the env file, as the issue
says) copies the image and appends the IPs; then a task run with `--runtime runsc` (the dev pool
offers runc and runsc) runs in gVisor: its `dmesg` is gVisor's boot, `task exec` runs inside the
same sandbox; `levers9 sandbox replace-eks-nodes` moves it off
the allow-list again; a restart pushes nothing again but reseeds moto, with the same EKS node IPs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from playwright.sync_api import expect, sync_playwright

from activities.kube_clients import KubeClients
from levers9.agent.cgroups import cgroup_dirs
from levers9.cli.runtime import read_env_file
from levers9.config import load
from sandbox import aws, buckets, registries, task_images, worker_image
from sandbox.admin_client import SandboxAdmin
from tests.devstack import Dev
from tests.waiting import until

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
CHROMIUM = "/usr/bin/chromium"


def _dev_key(home: Path) -> dict[str, str]:
    """The service-account key `dev up` wrote into the private values file."""
    private = json.loads((home / ".levers9" / "dev" / "private.json").read_text())
    credentials = private["config"]["worker"]["pools"]["gke-rtx6000"]["kubernetes"]["credentials"]
    key: dict[str, str] = json.loads(credentials)
    return key


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    stack = Dev(tmp_path_factory.mktemp("dev"))
    up = stack.run("dev", "up", *stack.ports, env={"LEVERS9_RECONCILE_INTERVAL_SECONDS": "1"})
    assert up.returncode == 0, up.stdout + up.stderr
    stack.up_stdout = up.stdout
    yield stack
    stack.run("dev", "down")


def test_up_starts_both_and_writes_env(dev: Dev) -> None:
    rows = dev.processes()
    assert {(row["component"], row["state"]) for row in rows} == {
        ("ecr", "running"),
        ("gar", "running"),
        ("moto", "running"),
        ("sandbox", "running"),
        ("temporal", "running"),
        ("worker", "running"),
    }
    env = read_env_file(dev.home / ".levers9" / "dev" / "env")
    assert env["TEMPORAL_ADDRESS"] == f"127.0.0.1:{dev.ports[1]}"
    assert env["LEVERS9_TEMPORAL_UI"] == f"http://127.0.0.1:{dev.ports[3]}"
    # The env file is what `temporal` needs too: the real CLI sees the dev pool's schedule.
    listed = subprocess.run(
        [str(BIN / "temporal"), "schedule", "list", "-o", "json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "reconcile:gke-rtx6000" in listed.stdout
    private = dev.home / ".levers9" / "dev" / "private.json"
    assert private.stat().st_mode & 0o777 == 0o600
    # The gateway speaks TLS by default, with a certificate the env file's CA verifies.
    host, _, port = env["LEVERS9_GATEWAY_ADDRESS"].rpartition(":")
    context = ssl.create_default_context(cafile=env["LEVERS9_GATEWAY_TLS_CA_FILE"])
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls_socket,
    ):
        assert tls_socket.version() in ("TLSv1.2", "TLSv1.3")
    key = dev.home / ".levers9" / "dev" / "gateway-tls" / "tls.key"
    assert key.stat().st_mode & 0o777 == 0o600


def _port(dev: Dev, flag: str) -> str:
    return dev.ports[dev.ports.index(flag) + 1]


def test_up_starts_the_cloud_around_the_sandbox(dev: Dev) -> None:
    env = dev.env
    ecr, gar = f"127.0.0.1:{_port(dev, '--ecr-port')}", f"127.0.0.1:{_port(dev, '--gar-port')}"
    moto = f"http://127.0.0.1:{_port(dev, '--moto-port')}"
    assert env["AWS_ENDPOINT_URL"] == moto
    assert env["AWS_ACCESS_KEY_ID"] == env["AWS_SECRET_ACCESS_KEY"] == "testing"
    assert env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert env["LEVERS9_EKS_CLUSTER"] == "levers9-controlplane"
    assert env["LEVERS9_SOURCE_IMAGE"] == f"{ecr}/levers9/worker:latest"
    assert env["LEVERS9_REGISTRY_MIRRORS"] == f"us-central1-docker.pkg.dev={gar}"
    assert env["LEVERS9_INSECURE_REGISTRIES"] == f"{ecr},{gar}"
    assert registries.ready(ecr)
    assert registries.ready(gar)
    # The worker image, runnable (on the Python image): pushed to ECR; the project's registry
    # has none until attach.
    base, _ = task_images.python_image()
    digest = worker_image.build(dev.home / "layout", base=base).digest
    assert registries.inspect_digest(env["LEVERS9_SOURCE_IMAGE"]) == digest
    assert registries.manifest_digest(gar, "demo/levers9/worker", "latest") is None
    # moto: the EKS nodes, tagged, with public IPs; the first is the sandbox's egress IP, and
    # it is not on the authorized networks yet.
    nodes = aws.node_ips(moto)
    assert len(nodes) == 2
    access = SandboxAdmin(Path(env["LEVERS9_SANDBOX_STATE"])).access()
    assert access["egressIp"] == nodes[0]
    assert f"{nodes[0]}/32" not in access["authorizedNetworks"]
    # The GCP APIs and the operator's key, for the python clients and gcloud.
    assert env["LEVERS9_GCP_ENDPOINT"].startswith("https://127.0.0.1:")
    assert Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).stat().st_mode & 0o777 == 0o600


def test_until_attach_reconcile_is_refused_and_attach_fixes_it(dev: Dev) -> None:
    """The issue's command, after `. .levers9/dev/env`; the worker log had the spec's 403."""
    log = dev.home / ".levers9" / "dev" / "logs" / "worker.log"
    refused = "unable to reconcile cluster nodes"

    def refused_line() -> str | None:
        return next((x for x in log.read_text().splitlines() if refused in x), None)

    line = until(refused_line, within=60, what=f"{refused!r} in {log}", poll=0.5)
    assert "403" in line
    done = _attach(dev)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "authorized networks: updated" in done.stdout
    assert "firewall rule levers9-controlplane-to-demo: created" in done.stdout
    access = SandboxAdmin(Path(dev.env["LEVERS9_SANDBOX_STATE"])).access()
    assert f"{access['egressIp']}/32" in access["authorizedNetworks"]
    gar = f"127.0.0.1:{_port(dev, '--gar-port')}"
    assert registries.manifest_digest(gar, "demo/levers9/worker", "latest") is not None
    # Reconcile is admitted now: workers come up on every machine.
    listed = _workers_available(dev, within=90)
    assert listed is None, f"workers not available after attach: {listed}"


def test_a_task_runs_in_gvisor_with_runtime_runsc(dev: Dev) -> None:
    """The issue's command on the dev stack: `levers9 run --runtime runsc -- dmesg`."""
    assert _workers_available(dev, within=90) is None
    run = ("run", "--pool", "gke-rtx6000", "--gpus", "0", "--runtime", "runsc")
    done = dev.run(*run, "--", "dmesg", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Starting gVisor..." in done.stdout, done.stdout
    task_id = done.stdout.split()[1]
    record = json.loads(dev.run("task", "get", task_id, "-o", "json").stdout)
    assert record["host"] == "runsc"
    plain = dev.run("run", "--pool", "gke-rtx6000", "--gpus", "0", "--", "dmesg", timeout=180)
    assert "Starting gVisor..." not in plain.stdout, "runc stays the pool's default"

    started = dev.run(*run, "--detach", "--", "sleep", "120")
    assert started.returncode == 0, started.stderr
    sleeper = started.stdout.split()[-1]
    try:

        def running() -> bool:
            got = dev.run("task", "get", sleeper, "-o", "json")
            return got.returncode == 0 and json.loads(got.stdout)["state"] == "running"

        until(running, within=120, what=f"task {sleeper} running", poll=0.5)
        script = "dmesg | head -1; tr '\\0' ' ' </proc/1/cmdline"
        inside = dev.run("exec", sleeper, "--", "sh", "-c", script)
        assert inside.returncode == 0, inside.stdout + inside.stderr
        assert "Starting gVisor..." in inside.stdout
        assert "sleep 120" in inside.stdout, "the exec runs beside the task, in its sandbox"
    finally:
        dev.run("task", "cancel", sleeper)


def test_the_dashboard_dev_up_printed_signs_in_with_the_dev_token(dev: Dev) -> None:
    """In a real browser (the system's Chromium): the URL `dev up` printed, the token in the
    file it named, and the dev pool's machines on the pools page."""
    assert _workers_available(dev, within=90) is None
    said = re.search(r"dashboard: (\S+) \(token: (\S+)\)", " ".join(dev.up_stdout.split()))
    assert said is not None, dev.up_stdout
    url, token_file = said.groups()
    assert url == dev.env["LEVERS9_ENDPOINTS_URL"] + "/ui/"
    token = Path(token_file).read_text().strip()
    listed = dev.run("machine", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    nodes = [m["node_name"] for m in json.loads(listed.stdout) if m["pool_name"] == "gke-rtx6000"]
    assert nodes
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            # The front's certificate is the dev stack's own CA's (docs/dashboard.md).
            page = browser.new_context(ignore_https_errors=True).new_page()
            page.goto(url)
            expect(page).to_have_url(url + "sign-in")
            page.get_by_test_id("token").fill(token)
            page.get_by_test_id("sign-in").click()
            expect(page).to_have_url(url + "tasks")
            expect(page.get_by_test_id("who")).to_have_text("operator")
            page.get_by_role("link", name="Pools").click()
            machines = page.get_by_test_id("machines")
            for node in nodes:
                expect(machines).to_contain_text(node, timeout=30_000)
            expect(page.get_by_test_id("pool-gke-rtx6000")).to_contain_text("card(s) free")
        finally:
            browser.close()


def _attach(dev: Dev) -> subprocess.CompletedProcess[str]:
    """The issue's attach command, after `. .levers9/dev/env`."""
    script = Path(__file__).parents[2] / "deploy" / "gke" / "attach-gke-pool.sh"
    command = (
        f". {dev.home / '.levers9' / 'dev' / 'env'} && {script} --project demo"
        " --zone us-central1-a --cluster demo --node-pool gpu-4x --gpu RTXPro6000"
    )
    env = {
        **os.environ,
        "LEVERS9_HOME": str(dev.home / ".levers9"),
        "LEVERS9": str(BIN / "levers9"),
    }
    env["PATH"] = f"{BIN}:{env['PATH']}"
    return subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=180
    )


def _workers_available(dev: Dev, within: float) -> str | None:
    """None once the three workers are available; what `worker list` said last if not."""
    said = [""]

    def available() -> bool:
        listed = dev.run("worker", "list", "-o", "json")
        said[0] = listed.stdout + listed.stderr
        rows = json.loads(listed.stdout) if listed.returncode == 0 else []
        return len(rows) == 3 and all(r["state"] == "available" for r in rows)

    try:
        until(available, within=within, what="three workers available", poll=1)
    except TimeoutError:
        return said[0]
    return None


def test_up_serves_s3_with_a_bucket_the_default_workspace_mounts(dev: Dev) -> None:
    """As README's Volumes section says: the bucket `up` made, its credentials file, and a task
    that writes to it through a volume (once attach let the pool have workers)."""
    moto = f"http://127.0.0.1:{_port(dev, '--moto-port')}"
    credentials = dev.home / ".levers9" / "dev" / buckets.CREDENTIALS_FILE
    assert credentials.stat().st_mode & 0o777 == 0o600
    listed = [b["Name"] for b in buckets.s3_client(moto).list_buckets()["Buckets"]]
    assert listed.count("levers9-default") == 1
    made = dev.run(
        *("volume", "create", "data", "--bucket", "s3://levers9-default/demo"),
        *("--endpoint", moto, "--credentials-file", str(credentials)),
    )
    assert made.returncode == 0, made.stdout + made.stderr
    shown = dev.run("volume", "list", "-o", "json")
    assert [(v["name"], v["workspace"]) for v in json.loads(shown.stdout)] == [("data", "default")]
    ran = dev.run(
        *("run", "--gpus", "0", "--wait", "240", "--volume", "data:/data"),
        *("--", "sh", "-c", "echo from-the-demo > /data/hello.txt"),
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    got = buckets.s3_client(moto).get_object(Bucket="levers9-default", Key="demo/hello.txt")
    assert got["Body"].read() == b"from-the-demo\n"
    deleted = dev.run("volume", "delete", "data")
    assert deleted.returncode == 0, deleted.stderr


def test_replace_eks_nodes_moves_the_egress_ip(dev: Dev) -> None:
    env = dev.env
    admin = SandboxAdmin(Path(env["LEVERS9_SANDBOX_STATE"]))
    before = admin.access()
    try:
        old = aws.node_ips(env["AWS_ENDPOINT_URL"])
        result = dev.run("sandbox", "replace-eks-nodes")
        assert result.returncode == 0, result.stderr
        new = aws.node_ips(env["AWS_ENDPOINT_URL"])
        assert not set(new) & set(old)
        assert f"{', '.join(old)} -> {', '.join(new)}" in result.stdout
        assert f"egress IP {before['egressIp']} -> {new[0]}" in result.stdout
        assert "not on the cluster's authorized networks" in result.stdout
        assert admin.access()["egressIp"] == new[0]
    finally:
        admin.update_access({"egressIp": before["egressIp"]})


def test_the_egress_allowlist_survives_a_kill9_of_the_controlplane(dev: Dev) -> None:
    """Attach started `egress:demo`; the Temporal worker killed with -9 and `dev up` again (the
    rest left running): the start waits on no workflow, and a rotation after it is appended to
    the cluster's authorized networks, beside what attach added."""
    [worker] = [p for p in dev.processes() if p["component"] == "worker"]
    pid = worker["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    until(lambda: not _alive(pid), within=10, what=f"Temporal worker {pid} gone", poll=0.1)
    up = dev.run("dev", "up", *dev.ports, env={"LEVERS9_RECONCILE_INTERVAL_SECONDS": "1"})
    assert up.returncode == 0, up.stdout + up.stderr
    rotated = dev.run("egress", "rotate", "--cluster", "demo", "--ip", "127.0.0.98")
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "127.0.0.98/32" in rotated.stdout
    access = SandboxAdmin(Path(dev.env["LEVERS9_SANDBOX_STATE"])).access()
    assert "127.0.0.98/32" in access["authorizedNetworks"]
    assert f"{access['egressIp']}/32" in access["authorizedNetworks"], "attach's IP kept"
    shown = dev.run("egress", "show", "--cluster", "demo")
    assert shown.returncode == 0, shown.stderr
    assert "127.0.0.98/32" in shown.stdout


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pool_list_reads_the_schedules(dev: Dev) -> None:
    result = dev.run("pool", "list", "-o", "json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)
    assert row["pool"] == "gke-rtx6000"
    assert row["every"] == "1s"


def test_up_writes_the_dev_profile_the_cli_runs_as_anywhere(dev: Dev, tmp_path: Path) -> None:
    """`dev up` writes profile `dev` (the gateway, its CA, the operator token), made current;
    with only that file, and no env file, the CLI is the operator on this stack."""
    config = dev.home / ".levers9" / "config"
    assert config.stat().st_mode & 0o777 == 0o600
    listed = dev.run("profile", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [profile] = json.loads(listed.stdout)
    assert (profile["name"], profile["current"], profile["token"]) == ("dev", True, "***")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "config").write_bytes(config.read_bytes())
    (elsewhere / "config").chmod(0o600)
    whoami = dev.run("whoami", "-o", "json", env={"LEVERS9_HOME": str(elsewhere)})
    assert whoami.returncode == 0, whoami.stderr
    shown = json.loads(whoami.stdout)
    assert (shown["operator"], shown["profile"]) == (True, "dev")
    assert shown["controlplane"] == dev.env["LEVERS9_GATEWAY_ADDRESS"]


def test_second_up_changes_nothing(dev: Dev) -> None:
    before = {row["component"]: row["pid"] for row in dev.processes()}
    again = dev.run("dev", "up", *dev.ports)
    assert again.returncode == 0, again.stderr
    assert {row["component"]: row["pid"] for row in dev.processes()} == before
    assert "starting" not in again.stdout


def test_taken_port_is_named(dev: Dev, tmp_path: Path) -> None:
    other = Dev(tmp_path)
    result = other.run(
        "dev", "up", "--temporal-port", dev.ports[1], "--ui-port", dev.ports[3], *other.ports[4:]
    )
    assert result.returncode == 1
    assert f"port {dev.ports[1]} on 127.0.0.1 is taken by pid" in result.stderr
    assert "--temporal-port" in result.stderr
    assert not _pids_mentioning(str(tmp_path)), "nothing started before the check"


def test_failed_start_stops_what_it_started(dev: Dev, tmp_path: Path) -> None:
    other = Dev(tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [{name: a}]\n")
    result = other.run("dev", "up", "--scenario", str(broken), *other.ports)
    assert result.returncode == 1
    assert "sandbox exited while starting" in result.stderr
    assert not _pids_mentioning(str(tmp_path))
    for flag in ("--ecr-port", "--gar-port", "--moto-port"):
        probe = socket.socket()
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listener still refuses
        try:
            probe.bind(("127.0.0.1", int(_port(other, flag))))  # nobody holds it any more
        finally:
            probe.close()


def test_config_check_masks_the_key(dev: Dev) -> None:
    dev_dir = dev.home / ".levers9" / "dev"
    result = dev.run(
        "config", "check", "-f", str(dev_dir / "values.yaml"), "-f", str(dev_dir / "private.json")
    )
    assert result.returncode == 0, result.stderr
    assert "gke-rtx6000" in result.stdout
    assert "inline (**********)" in result.stdout
    key = _dev_key(dev.home)
    assert key["private_key_id"] not in result.stdout


# Two whole stacks start and stop in this test: twice the suite's hang guard.
@pytest.mark.timeout(600)
def test_down_leaves_nothing_behind(tmp_path: Path) -> None:
    stack = Dev(tmp_path)
    try:
        assert stack.run("dev", "up", *stack.ports).returncode == 0
        pids = [int(str(row["pid"])) for row in stack.processes()]
        assert len(pids) == 6
        key_before = _dev_key(tmp_path)
        nodes_before = aws.node_ips(stack.env["AWS_ENDPOINT_URL"])
        assert stack.run("dev", "down").returncode == 0
        again = stack.run("dev", "up", *stack.ports)
        assert again.returncode == 0, again.stderr
        assert _dev_key(tmp_path) == key_before, "a restarted sandbox keeps its key and CA"
        assert "gke-demo-gpu-4x" in stack.kubectl("get", "nodes", "-o", "name")
        assert "pushed the worker image" not in again.stdout, "the registries keep their images"
        assert "seeded moto" in again.stdout, "moto's state is memory only: seeded again"
        nodes = aws.node_ips(stack.env["AWS_ENDPOINT_URL"])
        assert nodes == nodes_before, "AWS keeps its nodes (and their IPs) across a restart"
        assert (
            SandboxAdmin(tmp_path / ".levers9" / "dev" / "sandbox").access()["egressIp"] == nodes[0]
        )
        down = stack.run("dev", "down")
        assert down.returncode == 0, down.stderr
        assert "stopped: worker, temporal, sandbox, moto, gar, ecr" in down.stdout
        assert not _pids_mentioning(str(tmp_path))
        assert "nothing is running" in stack.run("dev", "status").stdout
        logs = "".join(p.read_text() for p in (tmp_path / ".levers9" / "dev" / "logs").iterdir())
        secret_line = _dev_key(tmp_path)["private_key"].splitlines()[1]
        assert secret_line not in logs
        assert "loaded controller gpu_type=RTXPro6000 mode=external pool_name=gke-rtx6000" in logs
    finally:
        stack.run("dev", "down")  # what a failed or timed-out step left running


def test_kubectl_sees_the_default_scenario(dev: Dev) -> None:
    names = dev.kubectl(
        "get", "nodes", "-l", "cloud.google.com/gke-accelerator=nvidia-rtx-pro-6000", "-o", "name"
    ).split()
    assert len(names) == 3
    assert "node/gke-demo-default-pool-9b1d4e7f-w2c6" in dev.kubectl("get", "nodes", "-o", "name")
    deploy = dev.kubectl("get", "deploy", "model-server", "-o", "jsonpath={.spec.replicas}")
    assert deploy == "1"


def test_dev_pool_key_authenticates_like_gke(dev: Dev, monkeypatch: pytest.MonkeyPatch) -> None:
    dev_dir = dev.home / ".levers9" / "dev"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", dev.env["REQUESTS_CA_BUNDLE"])
    pool = load([dev_dir / "values.yaml", dev_dir / "private.json"]).pools["gke-rtx6000"]
    egress = SandboxAdmin(Path(dev.env["LEVERS9_SANDBOX_STATE"])).access()["egressIp"]
    clients = KubeClients({"gke-rtx6000": pool})
    try:
        core = k8s.CoreV1Api(clients.api("gke-rtx6000"))
        selector = "cloud.google.com/gke-accelerator=nvidia-rtx-pro-6000"
        assert len(core.list_node(label_selector=selector).items) == 3
        moved = dev.run("sandbox", "egress-ip", "127.0.0.9")
        assert moved.returncode == 0, moved.stderr
        with pytest.raises(k8s.ApiException) as caught:
            core.list_node(label_selector=selector)
        assert caught.value.status == 403
        assert "127.0.0.9" in str(caught.value.body)
        assert dev.run("sandbox", "egress-ip", egress).returncode == 0
        assert len(core.list_node(label_selector=selector).items) == 3, "allowed again"
    finally:
        dev.run("sandbox", "egress-ip", egress)
        clients.close()


def test_scenario_commands(dev: Dev) -> None:
    added = dev.run("sandbox", "node", "add", "gke-demo-gpu-extra-1", "--gpus", "2")
    assert added.returncode == 0, added.stderr
    gpus = dev.kubectl(
        "get",
        "node",
        "gke-demo-gpu-extra-1",
        "-o",
        "jsonpath={.status.allocatable.nvidia\\.com/gpu}",
    )
    assert gpus == "2"
    assert dev.run("sandbox", "node", "not-ready", "gke-demo-gpu-extra-1").returncode == 0
    ready = dev.kubectl(
        "get",
        "node",
        "gke-demo-gpu-extra-1",
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    )
    assert ready == "False"
    assert dev.run("sandbox", "node", "remove", "gke-demo-gpu-extra-1").returncode == 0
    assert "gpu-extra" not in dev.kubectl("get", "nodes", "-o", "name")
    missing = dev.run("sandbox", "node", "remove", "no-such-node")
    assert missing.returncode == 1
    assert 'nodes "no-such-node" not found' in missing.stderr


def test_down_removes_what_a_killed_agent_left_and_status_lists_it(dev: Dev) -> None:
    """The last of the module (it takes the stack down): a task's agent SIGKILLed while its
    container runs leaves that container running (its shim is in a session of its own); `dev
    status` lists it as a stray, table and JSON, and `dev down` leaves no runc container, cgroup
    or mount of the stack behind."""
    if _workers_available(dev, within=5) is not None:
        attached = _attach(dev)
        assert attached.returncode == 0, attached.stdout + attached.stderr
        assert _workers_available(dev, within=90) is None
    started = dev.run("run", "--pool", "gke-rtx6000", "--detach", "--", "sleep", "1000")
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()

    def reported() -> dict[str, object] | None:
        """Running, and its start reported (the record says where it runs)."""
        got = dev.run("task", "get", task_id, "-o", "json")
        record: dict[str, object] = json.loads(got.stdout) if got.returncode == 0 else {}
        return record if record.get("state") == "running" and record.get("host") else None

    record = until(
        reported, within=60, what=f"task {task_id} running, its start reported", poll=0.5
    )
    assert record["host"] == "runc", "the dev pool's default image runs tasks in runc"
    sandbox = dev.home / ".levers9" / "dev" / "sandbox"
    [work] = sandbox.glob(f"nodes/*/var/lib/levers9/work/{record['worker_id']}")
    agent = json.loads((work / "agent.json").read_text())["pid"]
    os.kill(agent, signal.SIGKILL)
    gone = f"agent {agent} gone after SIGKILL"
    until(lambda: not Path(f"/proc/{agent}").exists(), within=30, what=gone, poll=0.1)

    table = dev.run("dev", "status")
    assert table.returncode == 0, table.stderr
    assert f"l9-{task_id}" in table.stdout, table.stdout
    rows = dev.processes()
    strays = [r for r in rows if r["component"] == "stray"]
    assert {"kind": "container", "name": f"l9-{task_id}"}.items() <= next(
        r for r in strays if r["kind"] == "container"
    ).items(), strays
    assert any(r["kind"] == "mount" and str(work) in str(r["name"]) for r in strays), strays
    assert cgroup_dirs(task_id), "the container runs on without its agent"

    down = dev.run("dev", "down")
    assert down.returncode == 0, down.stderr
    # The sandbox removes it as it stops (its log says so), else `dev down` does (it says so).
    sandbox_log = (dev.home / ".levers9" / "dev" / "logs" / "sandbox.log").read_text()
    assert f"removing stray container l9-{task_id}" in down.stdout + sandbox_log
    assert "could not remove" not in down.stdout, down.stdout
    listed = subprocess.run(
        ["runc", "--root", str(work / "runc"), "list", "-q"], capture_output=True, text=True
    )
    assert listed.stdout.split() == [], "no runc container of the stack is left"
    assert cgroup_dirs(task_id) == [], "nor its cgroup, nor any process of it"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(dev.home) not in mounts, "no mount under the stack's state dir"
    after = dev.run("dev", "status")
    assert "nothing is running" in after.stdout
    assert "stray" not in after.stdout
