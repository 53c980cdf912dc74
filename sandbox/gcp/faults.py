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

import itertools
import re
from dataclasses import dataclass
from typing import Any


@dataclass
class GcpFaultRule:
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

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times

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


class GcpFaults:
    """The active rules, first match wins."""

    def __init__(self) -> None:
        self._rules: list[GcpFaultRule] = []
        self._ids = itertools.count(1)

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
        rule = GcpFaultRule(
            id=next(self._ids),
            method=str(spec.get("method", "*")).upper(),
            path_regex=pattern,
            status=status,
            times=None if times is None else int(times),
            delay_seconds=float(spec.get("delaySeconds", 0)),
            retry_after_seconds=None if retry_after is None else int(retry_after),
            message=spec.get("message"),
        )
        self._rules.append(rule)
        return rule

    def rules(self) -> list[GcpFaultRule]:
        return list(self._rules)

    def remove(self, rule_id: int) -> bool:
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()

    def match(self, method: str, path: str) -> GcpFaultRule | None:
        """The rule this call trips, counted as fired."""
        for rule in self._rules:
            if rule.matches(method, path):
                rule.fired += 1
                return rule
        return None
