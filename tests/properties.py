"""One hypothesis setting for every property test of the suite.

In `make test` each property draws a fixed set of examples (`derandomize`: every run of the
suite draws the same, so a red CI reproduces), with a deadline generous enough for a loaded
machine that a hang still fails. `benchmarks/properties.py` sets LEVERS9_PROPERTY_SCALE to draw
that many times as many examples, at random, for the longer run the suite cannot afford.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

SCALE_ENV = "LEVERS9_PROPERTY_SCALE"


def scale() -> int:
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={raw!r}: a whole number of times, 1 or more") from None
    if value < 1:
        raise ValueError(f"{SCALE_ENV}={raw!r}: a whole number of times, 1 or more")
    return value


def examples(count: int, *, deadline: timedelta | None = timedelta(seconds=20)) -> settings:
    """`count` examples in the suite, drawn the same each run; `count` x the scale, at random,
    when the benchmark scales them."""
    times = scale()
    return settings(
        max_examples=count * times,
        derandomize=times == 1,
        database=None,
        deadline=deadline,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
