"""Staged failures and a count of API calls, for tests and benchmarks.

A rule matches requests by Kubernetes verb (`get`, `list`, `watch`, `create`, `update`,
`patch`, `delete`, `deletecollection`, or `*`) and resource (`pods`, `jobs`, `pods/eviction`,
or `*`), optionally a namespace, and then delays them (`delaySeconds`), fails them with the
apiserver's own Status for that code (`status`: 429 carries `Retry-After`, 500 an
InternalError, 503, 504 ...), or drops the connection (`drop`). `times` limits how often it
fires; exhausted rules stay listed with their `fired` count.

The request counter tallies every call that reached the API by verb and resource, so a test
can assert that a reconcile made a constant number of list calls.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sandbox.routing import RequestInfo

_VERBS = frozenset(
    {"*", "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
)


class StagedRule:
    """What every staged rule has: an id, how often it may fire (`times`; None: every time)
    and how often it has."""

    id: int
    times: int | None
    fired: int

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


@dataclass
class FaultRule(StagedRule):
    """One staged fault; `fired` counts how often it has matched."""

    id: int
    verb: str = "*"
    resource: str = "*"
    namespace: str | None = None
    status: int | None = None
    delay_seconds: float = 0.0
    drop: bool = False
    times: int | None = None
    retry_after_seconds: int | None = None
    message: str | None = None
    fired: int = 0

    def matches(self, info: RequestInfo) -> bool:
        if not info.is_resource_request or self.exhausted:
            return False
        if self.verb != "*" and self.verb != info.verb:
            return False
        if self.resource != "*" and self.resource not in (info.full_resource, info.resource_name):
            return False
        return self.namespace is None or self.namespace == info.namespace

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "verb": self.verb,
            "resource": self.resource,
            "namespace": self.namespace,
            "status": self.status,
            "delaySeconds": self.delay_seconds,
            "drop": self.drop,
            "times": self.times,
            "retryAfterSeconds": self.retry_after_seconds,
            "message": self.message,
            "fired": self.fired,
        }


RuleT = TypeVar("RuleT", bound=StagedRule)


class StagedRules(Generic[RuleT]):
    """Staged rules, each with an id of its own, first match wins (this API's and GCP's)."""

    def __init__(self) -> None:
        self._rules: list[RuleT] = []
        self._ids = itertools.count(1)

    def _next_id(self) -> int:
        return next(self._ids)

    def _stage(self, rule: RuleT) -> RuleT:
        self._rules.append(rule)
        return rule

    def rules(self) -> list[RuleT]:
        return list(self._rules)

    def remove(self, rule_id: int) -> bool:
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()

    def _first(self, matches: Callable[[RuleT], bool]) -> RuleT | None:
        """The first rule that `matches`, counted as fired."""
        for rule in self._rules:
            if matches(rule):
                rule.fired += 1
                return rule
        return None


class FaultInjector(StagedRules[FaultRule]):
    """The active fault rules, first match wins."""

    def add(self, spec: dict[str, Any]) -> FaultRule:
        """A rule from its JSON form (`verb`, `resource`, `namespace`, `status`,
        `delaySeconds`, `drop`, `times`, `retryAfterSeconds`, `message`); ValueError if bad."""
        verb = str(spec.get("verb", "*"))
        if verb not in _VERBS:
            raise ValueError(f"unknown verb {verb!r}")
        status = spec.get("status")
        if status is not None and not (400 <= int(status) <= 599):
            raise ValueError("status must be an HTTP error code (400-599)")
        times = spec.get("times")
        if times is not None and int(times) < 0:
            raise ValueError("times must be >= 0")
        rule = FaultRule(
            id=self._next_id(),
            verb=verb,
            resource=str(spec.get("resource", "*")),
            namespace=spec.get("namespace"),
            status=None if status is None else int(status),
            delay_seconds=float(spec.get("delaySeconds", 0)),
            drop=bool(spec.get("drop", False)),
            times=None if times is None else int(times),
            retry_after_seconds=spec.get("retryAfterSeconds"),
            message=spec.get("message"),
        )
        if rule.status is None and not rule.drop and not rule.delay_seconds:
            raise ValueError("a rule needs a status, a delay or drop")
        return self._stage(rule)

    def match(self, info: RequestInfo) -> FaultRule | None:
        """The rule this request trips, counted as fired."""
        return self._first(lambda rule: rule.matches(info))


class RequestCounter:
    """Calls that reached the API, by verb and resource (or path, for discovery)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def count(self, info: RequestInfo) -> None:
        what = info.full_resource if info.is_resource_request else info.path
        self._counts[(info.verb, what)] += 1

    def get(self, verb: str, resource: str) -> int:
        return self._counts[(verb, resource)]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def reset(self) -> None:
        self._counts.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "counts": [
                {"verb": verb, "resource": resource, "count": count}
                for (verb, resource), count in sorted(self._counts.items())
            ],
        }
