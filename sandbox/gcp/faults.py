"""Staged failures of the Google Cloud APIs, for tests of retries and conflicts.

A rule matches calls by HTTP method (`GET`, `POST` ... or `*`) and a regular expression
searched in the path (`pathRegex`, e.g. `/global/firewalls$` or `:setIamPolicy`), and answers
them with `status` in the dialect of the API called (429 `RESOURCE_EXHAUSTED` with
`Retry-After` when `retryAfterSeconds` is given, 503 `UNAVAILABLE`, 409, 412 ...) after an
optional `delaySeconds`. `times` limits how often it fires (default: once); exhausted rules
stay listed with their `fired` count. Faults fire before authentication, as a front end's
would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandbox.faults import StagedRule, StagedRules


@dataclass
class GcpFaultRule(StagedRule):
    """One staged fault; `fired` counts how often it has matched."""

    id: int
    method: str
    path_regex: re.Pattern[str]
    status: int
    times: int | None = 1
    delay_seconds: float = 0.0
    retry_after_seconds: int | None = None
    message: str | None = None
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.exhausted or self.method not in ("*", method.upper()):
            return False
        return self.path_regex.search(path) is not None

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "method": self.method,
            "pathRegex": self.path_regex.pattern,
            "status": self.status,
            "times": self.times,
            "delaySeconds": self.delay_seconds,
            "retryAfterSeconds": self.retry_after_seconds,
            "message": self.message,
            "fired": self.fired,
        }


class GcpFaults(StagedRules[GcpFaultRule]):
    """The active rules, first match wins."""

    def add(self, spec: dict[str, Any]) -> GcpFaultRule:
        """A rule from its JSON form; ValueError if it is not one."""
        status = int(spec["status"])
        if not 400 <= status <= 599:
            raise ValueError("status must be an HTTP error code (400-599)")
        times = spec.get("times", 1)
        if times is not None and int(times) < 0:
            raise ValueError("times must be >= 0 (null: every matching call)")
        try:
            pattern = re.compile(str(spec.get("pathRegex", "")))
        except re.error as error:
            raise ValueError(f"pathRegex: {error}") from None
        retry_after = spec.get("retryAfterSeconds")
        return self._stage(
            GcpFaultRule(
                id=self._next_id(),
                method=str(spec.get("method", "*")).upper(),
                path_regex=pattern,
                status=status,
                times=None if times is None else int(times),
                delay_seconds=float(spec.get("delaySeconds", 0)),
                retry_after_seconds=None if retry_after is None else int(retry_after),
                message=spec.get("message"),
            )
        )

    def match(self, method: str, path: str) -> GcpFaultRule | None:
        """The rule this call trips, counted as fired."""
        return self._first(lambda rule: rule.matches(method, path))
