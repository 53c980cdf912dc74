"""Exponential back-off with a ceiling and jitter, for calls to the gateway.

The ceiling bounds how long a worker stays silent after the gateway comes back; the jitter
keeps a fleet of workers from retrying in step after a controlplane restart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5
    ceiling_s: float = 30.0
    factor: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before retry `attempt` (0-based): half the exponential step, plus up to
        the other half at random ("equal jitter": never zero, never above the ceiling)."""
        step = min(self.ceiling_s, self.first_s * self.factor ** min(attempt, 64))
        return step / 2 + rng.uniform(0, step / 2)
