"""How fast the CLI starts and answers, against a running dev stack (`make demo` first: it
attaches the pool and leaves the stack up; `. .levers9/dev/env`).

Each command runs `--runs` times as its own process, the way a user runs it. For each: the
median and the least of its CPU seconds (user + system of the process, from wait4: what the
command itself costs, whatever else the machine is doing) and of its wall seconds (submit to
result, which the dev stack's own load on the same two cores inflates). Targets (issue 15):
`--help` at most 0.3 s, `task get` at most 0.5 CPU-s, `run -- true` on a warm worker at most 1 s.

    python benchmarks/cli.py [--runs 10] [--pool gke-rtx6000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

LEVERS9 = str(Path(sys.executable).parent / "levers9")


def _measure(argv: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one run of `argv` as a child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    # communicate() reaped the child; its usage is in RUSAGE_CHILDREN's increment.
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err.strip()[-500:]}")
    return _child_cpu(), wall, out


_last_children = 0.0


def _child_cpu() -> float:
    global _last_children
    usage = os.times()
    total = usage.children_user + usage.children_system
    spent, _last_children = total - _last_children, total
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--pool", default="gke-rtx6000")
    args = parser.parse_args()
    if "LEVERS9_API_TOKEN_FILE" not in os.environ and "LEVERS9_API_TOKEN" not in os.environ:
        raise SystemExit("source the dev stack's env first: . .levers9/dev/env (after make demo)")
    _child_cpu()
    _, _, out = _measure([LEVERS9, "run", "--pool", args.pool, "--", "true"])
    task_id = out.split()[1]
    commands = {
        "levers9 --help": [LEVERS9, "--help"],
        "levers9 task get ID": [LEVERS9, "task", "get", task_id],
        "levers9 run -- true": [LEVERS9, "run", "--pool", args.pool, "--", "true"],
    }
    print(f"nproc={os.cpu_count()} {platform.processor() or platform.machine()}", flush=True)
    print("| command | CPU s median | CPU s least | wall s median | wall s least |")
    print("| - | - | - | - | - |")
    for name, argv in commands.items():
        cpu, wall = [], []
        for _ in range(args.runs):
            c, w, _ = _measure(argv)
            cpu.append(c)
            wall.append(w)
        print(
            f"| `{name}` | {statistics.median(cpu):.2f} | {min(cpu):.2f}"
            f" | {statistics.median(wall):.2f} | {min(wall):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
