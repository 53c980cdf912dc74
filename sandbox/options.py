"""`DeleteOptions` and what a delete returns, shared by the registry and the collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandbox import errors

_PROPAGATION = ("Foreground", "Background", "Orphan")


@dataclass(frozen=True)
class DeleteOptions:
    """`metav1.DeleteOptions`, from a DELETE body or query."""

    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @staticmethod
    def from_body(body: dict[str, Any] | None, query: dict[str, str]) -> DeleteOptions:
        body = body or {}
        pre = body.get("preconditions") or {}
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        policy = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if policy is None and orphan is not None:
            policy = "Orphan" if str(orphan).lower() == "true" else "Background"
        if policy is not None and policy not in _PROPAGATION:
            raise errors.ApiError(
                422,
                "Invalid",
                f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                f'"{policy}": supported values: "Foreground", "Background", "Orphan"',
                {"group": "meta.k8s.io", "kind": "DeleteOptions"},
            )
        try:
            grace_value = None if grace is None else int(grace)
        except ValueError:
            raise errors.bad_request(f"invalid gracePeriodSeconds: {grace}") from None
        dry = body.get("dryRun") or query.get("dryRun")
        return DeleteOptions(
            grace_period_seconds=grace_value,
            propagation_policy=policy,
            precondition_uid=pre.get("uid"),
            precondition_rv=pre.get("resourceVersion"),
            dry_run=bool(dry),
        )


@dataclass
class DeleteOutcome:
    """What a delete left behind: the object (final or pending) and whether it is gone."""

    object: dict[str, Any]
    finished: bool
    warnings: list[str] = field(default_factory=list)
