"""Whatever a user types or writes, only the project's own refusals come back (hypothesis, a
fixed seed: `derandomize`, as every run of the suite draws the same examples):

- values files of text drawn from YAML's own characters, documents nested at random depths,
  keys written twice, quantities and node selectors of any text: `load` gives values or a
  `ConfigError`, never another exception, and in bounded time (an exponent of 1e999999999
  once took forever);
- the CLI's option helpers (`KEY=VALUE`, environment names, labels, durations, quantities,
  ports, the UTF-8 check, the task input limit): a value or `typer.BadParameter` (ValueError
  for the quantity parser, whose callers turn it into one), nothing else;
- `levers9 run` and `levers9 endpoint create` parsing options drawn at random (through typer's
  CliRunner, with no controlplane to reach): exit status 1 or 2 with a message, or the
  project's `Unreachable` once everything parsed; never a traceback of another exception.
"""

from __future__ import annotations

import os
import string
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from levers9 import logs
from levers9.cli.main import app, not_utf8
from levers9.cli.runtime import duration, environment, key_values, labels
from levers9.cli.task import _ports, _quantity
from levers9.config import ConfigError, load
from levers9.contract import task_input_problem
from levers9.core.quantity import millicores, whole
from levers9.errors import Unreachable
from tests.factories import key_json, spec_pool, values_doc
from tests.properties import examples

EXAMPLES = examples(60, deadline=timedelta(seconds=10))
CLI_EXAMPLES = examples(30, deadline=timedelta(seconds=10))

YAML_TEXT = st.text(alphabet=string.printable + "&*!|>%@`{}[],:#-?'\"\u00e9\u2603", max_size=200)
QUANTITY_STR = st.one_of(
    st.text(alphabet="0123456789.eE+-kKMGTPEimnu ", max_size=16),
    st.from_regex(r"[+-]?[0-9]{1,4}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,10}|[KMGTPE]i?|[mnuk])?"),
)
QUANTITY_TEXT = st.one_of(
    QUANTITY_STR,
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
)
LABEL_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "-_./= :\u00e9", max_size=70)


def _refused(call: Any, *args: Any, refusal: type[Exception] = ConfigError) -> list[str] | None:
    """What `call` said in refusal (its lines), or None when it gave a value; any exception but
    `refusal` goes through and fails the test."""
    try:
        call(*args)
    except refusal as error:
        if isinstance(error, ConfigError):
            return error.errors
        if isinstance(error, typer.BadParameter):
            return [error.format_message()]
        return [str(error)]
    return None


def _loads_or_refuses(path: Path) -> None:
    """`load` gives values or ConfigError naming the file or a field; anything else fails."""
    errors = _refused(load, [path])
    if errors is not None:
        assert errors
        assert all(line.startswith((f"{path}:", "config")) for line in errors), errors


@EXAMPLES
@given(text=YAML_TEXT)
def test_any_text_in_a_values_file_loads_or_is_refused(
    text: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("values") / "values.yaml"
    path.write_text(text, encoding="utf-8")
    _loads_or_refuses(path)


@examples(20, deadline=timedelta(seconds=10))
@given(
    depth=st.one_of(st.integers(0, 130), st.sampled_from([1000, 5000])),
    opening=st.sampled_from(["[", "{a: ", "- "]),
)
def test_a_document_nested_at_any_depth_loads_or_is_refused(
    depth: int, opening: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("values") / "deep.yaml"
    closing = {"[": "]", "{a: ": "}", "- ": ""}[opening]  # `- - - 1`: sequences in sequences
    path.write_text(opening * depth + "1" + closing * depth, encoding="utf-8")
    _loads_or_refuses(path)


SPEC_LINES = yaml.safe_dump(
    values_doc({"gke-rtx6000": spec_pool(credentials="a-key")}), sort_keys=False, width=10_000
).splitlines()
KEY_LINES = [i for i, line in enumerate(SPEC_LINES) if not line.lstrip().startswith("-")]


@EXAMPLES
@given(at=st.sampled_from(KEY_LINES), value=st.sampled_from(["1", "x", "{}", "[a]", "null"]))
def test_a_key_written_twice_anywhere_is_refused_naming_it(
    at: int, value: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    line = SPEC_LINES[at]
    indent = line[: len(line) - len(line.lstrip())]
    key = line.strip().split(":", 1)[0]
    end = at + 1  # the same key again, at its indent, right after its own block
    while end < len(SPEC_LINES) and (
        SPEC_LINES[end].startswith(indent + " ") or SPEC_LINES[end].startswith(indent + "-")
    ):
        end += 1
    doubled = [*SPEC_LINES[:end], f"{indent}{key}: {value}", *SPEC_LINES[end:]]
    path = tmp_path_factory.mktemp("values") / "twice.yaml"
    path.write_text("\n".join(doubled) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load([path])
    [error] = refused.value.errors
    assert error.startswith(f"{path}: key {key!r} is written twice in one map (lines {at + 1}"), (
        error
    )


@EXAMPLES
@given(
    field=st.sampled_from(
        [
            ("taskDefaults", "memory"),
            ("taskDefaults", "cpus"),
            ("workerResources", "memory"),
            ("workerResources", "cpu"),
            ("imageCacheSize",),
        ]
    ),
    value=QUANTITY_TEXT,
)
def test_any_quantity_loads_or_is_refused_at_once(
    field: tuple[str, ...], value: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    block: dict[str, Any] = spec_pool(credentials=key_json())
    if len(field) == 2:
        block[field[0]] = {field[1]: value}
    else:
        block[field[0]] = value
    path = tmp_path_factory.mktemp("values") / "q.yaml"
    path.write_text(yaml.safe_dump(values_doc({"gke-rtx6000": block})), encoding="utf-8")
    _loads_or_refuses(path)


@EXAMPLES
@given(selector=st.dictionaries(LABEL_TEXT, LABEL_TEXT, max_size=3))
def test_any_node_selector_loads_or_is_refused(
    selector: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    block = spec_pool(credentials=key_json(), nodeSelector=selector)
    path = tmp_path_factory.mktemp("values") / "s.yaml"
    path.write_text(yaml.safe_dump(values_doc({"gke-rtx6000": block})), encoding="utf-8")
    _loads_or_refuses(path)


# --- the CLI's option helpers ----------------------------------------------------------------

PAIRS = st.lists(st.text(max_size=30), max_size=4)


def _helper_refuses_clearly(call: Any, *args: Any) -> None:
    said = _refused(call, *args, refusal=typer.BadParameter)
    assert said is None or all(said), said


@EXAMPLES
@given(pairs=PAIRS)
def test_key_value_helpers_give_values_or_bad_parameter(pairs: list[str]) -> None:
    _helper_refuses_clearly(key_values, pairs, "--env")
    _helper_refuses_clearly(environment, pairs, "--env")
    _helper_refuses_clearly(labels, pairs, "--node-selector")


@EXAMPLES
@given(text=st.one_of(st.text(max_size=20), QUANTITY_STR))
def test_durations_and_quantities_give_values_or_bad_parameter(text: str) -> None:
    if text:
        _helper_refuses_clearly(duration, text, "--wait")
    _helper_refuses_clearly(_quantity, "--memory", text, True)
    _helper_refuses_clearly(_quantity, "--cpus", text, False)
    for parse in (whole, millicores):
        said = _refused(parse, text, refusal=ValueError)
        assert said is None or all(said), said


@EXAMPLES
@given(ports=st.lists(st.integers(-5, 70_000), max_size=20))
def test_ports_give_values_or_bad_parameter(ports: list[int]) -> None:
    _helper_refuses_clearly(_ports, ports)


@EXAMPLES
@given(
    argv=st.lists(st.binary(max_size=20), max_size=5),
    command=st.lists(st.text(max_size=40_000), max_size=5),
    env=st.dictionaries(st.text(max_size=10), st.text(max_size=40_000), max_size=3),
)
def test_the_utf8_check_and_the_input_limit_say_or_pass(
    argv: list[bytes], command: list[str], env: dict[str, str]
) -> None:
    decoded = [os.fsdecode(arg) for arg in argv]
    problem = not_utf8(decoded)
    utf8 = all(_is_utf8(arg) for arg in argv)
    assert (problem is None) == utf8, (argv, problem)
    said = task_input_problem(command, env)
    assert said is None or said


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- whole commands, parsed as typed ----------------------------------------------------------

OPTION_TEXT = st.one_of(st.text(max_size=12), QUANTITY_STR)


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A shell with no controlplane: nothing answers at TEMPORAL_ADDRESS, no token, no dev env."""
    return {
        "LEVERS9_HOME": str(tmp_path_factory.mktemp("home")),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
        "LEVERS9_API_TOKEN": "",
        "LEVERS9_API_TOKEN_FILE": "",
        "LEVERS9_WORKER_TOKEN_SECRET": "",
        "COLUMNS": "200",
    }


def _invoked_cleanly(args: list[str], env: dict[str, str]) -> None:
    try:
        result = CliRunner().invoke(app, args, env=env)
    finally:
        # The CLI points the process's logging at the stderr it was given, the runner's, which
        # the runner closes: a later test's server in this process would then fail each call
        # it logs ("I/O operation on closed file", seen from test_bad_input in a longer run).
        logs.setup("INFO", sys.stderr)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert isinstance(result.exception, Unreachable), (args, repr(result.exception))
        return
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    if result.exit_code:
        assert result.output.strip(), args


@CLI_EXAMPLES
@given(
    gpus=OPTION_TEXT,
    memory=OPTION_TEXT,
    cpus=OPTION_TEXT,
    port=OPTION_TEXT,
    wait=OPTION_TEXT,
    grace=OPTION_TEXT,
    command=st.lists(st.text(min_size=1, max_size=20), max_size=3),
)
def test_run_parses_any_options_into_a_message_or_a_submit(
    runner_env: dict[str, str],
    gpus: str,
    memory: str,
    cpus: str,
    port: str,
    wait: str,
    grace: str,
    command: list[str],
) -> None:
    args = ["run", "--pool", "p", "--gpus", gpus, "--memory", memory, "--cpus", cpus]
    args += ["--port", port, "--wait", wait, "--stop-grace", grace, "--", *command]
    _invoked_cleanly(args, runner_env)


@CLI_EXAMPLES
@given(
    name=st.text(max_size=12),
    env=st.lists(st.text(max_size=20), max_size=3),
    timeout=OPTION_TEXT,
    ready=st.text(max_size=10),
    replicas=st.tuples(OPTION_TEXT, OPTION_TEXT),
)
def test_endpoint_create_parses_any_options_into_a_message_or_a_create(
    runner_env: dict[str, str],
    name: str,
    env: list[str],
    timeout: str,
    ready: str,
    replicas: tuple[str, str],
) -> None:
    args = ["endpoint", "create", name or "e", "--pool", "p", "--port", "80"]
    args += ["--request-timeout", timeout, "--ready-path", ready]
    args += ["--min-replicas", replicas[0], "--max-replicas", replicas[1]]
    for pair in env:
        args += ["-e", pair]
    _invoked_cleanly([*args, "--", "true"], runner_env)
