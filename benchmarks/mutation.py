"""Mutation check (issue 34): mutmut over the placement and capacity logic, the task records and
PoolWorkflow, each run only against the tests that exercise it, and the figures per module.

    python benchmarks/mutation.py [--modules capacity placement task_records pool]
                                  [--max-children 2] [--dir build/mutation] [--keep]

mutmut works in a copy of the tree (`--dir`, under the ignored build/): it needs its own
`[tool.mutmut]` table, and its `mutants/` folder must not land in the checkout. The copy is laid
anew each run unless `--keep` (then mutmut reuses the results it has for unchanged functions).
mutmut comes from the optional extra `mutation`; the script installs it when it is missing.

mutmut mutates only undecorated functions (and static/class methods): in workflows/pool.py the
signal, Update, query and run handlers are decorated, so only `_tells_after_continuing`,
`_assign`, `_tell` and `_tell_one` are mutated there, against the dev-server workflow tests of
tests/integration/test_pool_workflow.py (a conftest.py written into the copy lets mutmut's
trampoline through the workflow sandbox). In levers9/records/tasks.py the
async Temporal client calls (start_task, task_record, ...) are exercised only by the sandbox
integration tests, too costly to run per mutant: their mutants count as "no tests".

Prints, per module, killed / survived / timeout / no tests / other, then each surviving mutant
by name (`mutmut show NAME` in `--dir` prints its diff). Not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULES: dict[str, tuple[str, list[str]]] = {
    "capacity": (
        "levers9/core/capacity.py",
        [
            "tests/unit/test_capacity.py",
            "tests/unit/test_capacity_edges.py",
            "tests/unit/test_observation.py",
        ],
    ),
    "placement": ("levers9/core/placement.py", ["tests/unit/test_placement.py"]),
    "task_records": ("levers9/records/tasks.py", ["tests/unit/test_gpu_check.py"]),
    "pool": ("workflows/pool.py", ["tests/integration/test_pool_workflow.py"]),
}
"""Module key -> (its file, the test files that exercise it)."""

COPIED = ["levers9", "workflows", "activities", "sandbox", "tests", "worker_main.py"]

SANDBOX_CONFTEST = '''"""Written by benchmarks/mutation.py into its copy only: a mutated
function asks mutmut's trampoline which mutant runs, which reads os.environ, and Temporal's
workflow sandbox refuses that inside a workflow; so the sandbox of a Worker built with the
default runner passes mutmut through."""

from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

assert Worker.__init__.__kwdefaults__ is not None
Worker.__init__.__kwdefaults__["workflow_runner"] = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("mutmut")
)
'''
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".levers9")


def ensure_mutmut() -> str:
    """mutmut's version, installed first from the extra `mutation` when it is missing."""
    try:
        return metadata.version("mutmut")
    except metadata.PackageNotFoundError:
        pass
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = extras["optional-dependencies"]["mutation"]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *wanted], check=True)
    return metadata.version("mutmut")


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def mutmut_table(files: list[str], tests: list[str], *, forkserver: bool) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["levers9", "workflows"]\n'
        f"only_mutate = {toml_list(files)}\n"
        'also_copy = ["activities", "sandbox", "worker_main.py", "conftest.py"]\n'
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
        # One process per test run (no xdist), no cache writes into the copy.
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-n", "0"]\n'
        "use_git_change_detection = false\n"
        # A mutant that makes a workflow fail its task hangs the test rather than failing it:
        # give up after twice (the tests' own seconds + 10, the dev server's start), not 15 times.
        "timeout_multiplier = 2.0\n"
        "timeout_constant = 10.0\n"
        # Temporal's client runtime (Rust threads) does not survive a fork: a mutant forked from
        # the process that ran the workflow tests hangs at its first connect. Fork each from a
        # server that has only collected the tests.
        + (f'process_isolation = "{"forkserver" if forkserver else "fork"}"\n')
    )


def lay_copy(workdir: Path, files: list[str], tests: list[str], keep: bool) -> None:
    if workdir.exists() and not keep:
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source, target = ROOT / name, workdir / name
        if target.exists():
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        else:
            shutil.copy2(source, target)
    (workdir / "conftest.py").write_text(SANDBOX_CONFTEST)
    pyproject = (ROOT / "pyproject.toml").read_text()
    table = mutmut_table(files, tests, forkserver="workflows/pool.py" in files)
    (workdir / "pyproject.toml").write_text(pyproject + table)


def mutmut(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mutmut", *args]
    return subprocess.run(command, cwd=workdir, text=True, capture_output=True, check=False)


RESULT = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+)$")


def tally(workdir: Path, keys: list[str]) -> tuple[dict[str, Counter[str]], dict[str, list[str]]]:
    listing = mutmut(workdir, "results", "--all", "true")
    if listing.returncode != 0:
        sys.exit(f"mutmut results failed:\n{listing.stdout}{listing.stderr}")
    counts: dict[str, Counter[str]] = {key: Counter() for key in keys}
    survivors: dict[str, list[str]] = {key: [] for key in keys}
    for line in listing.stdout.splitlines():
        match = RESULT.match(line)
        if match is None:
            continue
        name, status = match["name"], match["status"].strip()
        for key in keys:
            if name.startswith(dotted(MODULES[key][0]) + "."):
                counts[key][status] += 1
                if status == "survived":
                    survivors[key].append(name)
    return counts, survivors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", choices=list(MODULES), default=list(MODULES))
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=ROOT / "build" / "mutation")
    parser.add_argument("--keep", action="store_true", help="reuse the results in --dir")
    args = parser.parse_args()

    version = ensure_mutmut()

    files = [MODULES[key][0] for key in args.modules]
    tests = list(dict.fromkeys(t for key in args.modules for t in MODULES[key][1]))
    workdir = args.dir.resolve()
    lay_copy(workdir, files, tests, args.keep)

    started = time.monotonic()
    run = mutmut(workdir, "run", "--max-children", str(args.max_children))
    elapsed = time.monotonic() - started
    # Its progress line redraws itself thousands of times: kept in a file, not printed.
    (workdir / "mutmut-run.log").write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        tail = (run.stdout + run.stderr)[-4000:]
        sys.exit(f"mutmut run exited {run.returncode}; the end of its output:\n{tail}")

    counts, survivors = tally(workdir, args.modules)
    print(
        f"\nmutmut {version}, Python {platform.python_version()}, nproc={os.cpu_count()}, "
        f"max-children={args.max_children}, {elapsed:.0f} s"
    )
    print(f"tests: {' '.join(tests)}")
    statuses = ["killed", "survived", "timeout", "no tests"]
    print(f"\n| module | mutants | {' | '.join(statuses)} | other |")
    print("| - | - | " + " | ".join("-" for _ in statuses) + " | - |")
    for key in args.modules:
        count = counts[key]
        other = sum(n for status, n in count.items() if status not in statuses)
        cells = " | ".join(str(count[status]) for status in statuses)
        print(f"| {MODULES[key][0]} | {sum(count.values())} | {cells} | {other} |")
    for key in args.modules:
        for name in survivors[key]:
            print(f"survived: {name}")
    print(f"\n(diffs: cd {workdir} && {sys.executable} -m mutmut show NAME)")


if __name__ == "__main__":
    main()
