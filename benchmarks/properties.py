"""The suite's property tests, drawn at length: every hypothesis test of the suite with
LEVERS9_PROPERTY_SCALE times its examples, at random (tests/properties.py), where `make test`
draws a fixed few. A failure prints hypothesis's shrunk example; fix it, and add it to the
suite as an explicit case (as tests/agent/test_rpc_properties.py does for what its draws
found).

    python benchmarks/properties.py [--scale 50] [--seed N] [pytest args...]

Prints each file's outcome, the examples drawn (hypothesis's statistics) and the run's CPU
seconds. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "tests/reliability/test_door_properties.py",
    "tests/reliability/test_bad_input.py",
    "tests/agent/test_rpc_properties.py",
    "tests/gateway/test_submit_properties.py",
    "tests/unit/test_quantity.py",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=50, help="times the suite's examples")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis's seed (default: any)")
    args, passthrough = parser.parse_known_args()
    if args.scale < 1:
        parser.error("--scale: a whole number of times, 1 or more")
    env = {**os.environ, "LEVERS9_PROPERTY_SCALE": str(args.scale)}
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
        "--hypothesis-show-statistics", "-o", "timeout=3600", *FILES, *passthrough,
    ]  # fmt: skip
    if args.seed is not None:
        command += ["--hypothesis-seed", str(args.seed)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, check=False)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"properties: scale={args.scale} exit={done.returncode}"
        f" cpu_s={children.ru_utime + children.ru_stime:.1f}"
        f" wall_s={time.monotonic() - started:.1f}"
    )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
