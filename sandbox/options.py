"""`DeleteOptions` and what a delete returns, shared by the registry and the collector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.errors import Cause

if TYPE_CHECKING:
    from sandbox.resources import Resource

_PROPAGATION = ("Foreground", "Background", "Orphan")
DRY_RUN_ALL = "All"


def dry_run_causes(values: Sequence[str]) -> list[Cause]:
    """`ValidateDryRun`: every value must be `All` (the only dry run there is)."""
    if all(value == DRY_RUN_ALL for value in values):
        return []
    return [Cause.unsupported("dryRun", list(values), [DRY_RUN_ALL])]


def dry_run(values: Sequence[str], options_kind: str) -> bool:
    """Whether a write is a dry run, from its `dryRun` values (the query's, repeated as the
    apiserver reads them); anything but `All` is 422 against `options_kind` (`CreateOptions`,
    `UpdateOptions`, `PatchOptions`), before the body is read, so nothing is written."""
    causes = dry_run_causes(values)
    if causes:
        raise errors.invalid_options(options_kind, causes)
    return bool(values)


@dataclass(frozen=True)
class DeleteOptions:
    """`metav1.DeleteOptions`, from a DELETE body or query."""

    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @staticmethod
    def from_body(
        body: dict[str, Any] | None, query: dict[str, str], dry_run: Sequence[str] = ()
    ) -> DeleteOptions:
        """From the request's DeleteOptions body, or its query (`dry_run`: the query's
        `dryRun` values); 422 for a policy or dry run the apiserver does not know."""
        body = body or {}
        pre = body.get("preconditions") or {}
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        policy = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if policy is None and orphan is not None:
            policy = "Orphan" if str(orphan).lower() == "true" else "Background"
        causes: list[Cause] = []
        if policy is not None and policy not in _PROPAGATION:
            causes.append(Cause.unsupported("propagationPolicy", policy, [*_PROPAGATION, "nil"]))
        given = body.get("dryRun", dry_run)
        dry = [given] if isinstance(given, str) else [str(v) for v in given or ()]
        causes.extend(dry_run_causes(dry))
        if causes:
            raise errors.invalid_options("DeleteOptions", causes)
        try:
            grace_value = None if grace is None else int(grace)
        except ValueError:
            raise errors.bad_request(f"invalid gracePeriodSeconds: {grace}") from None
        return DeleteOptions(
            grace_period_seconds=grace_value,
            propagation_policy=policy,
            precondition_uid=pre.get("uid"),
            precondition_rv=pre.get("resourceVersion"),
            dry_run=bool(dry),
        )

    def check_preconditions(self, resource: Resource, name: str, meta: Mapping[str, Any]) -> None:
        """409 Conflict when the object (its `metadata`) is not the one the preconditions name."""
        if self.precondition_uid and self.precondition_uid != meta["uid"]:
            raise errors.conflict(
                resource,
                name,
                (
                    f"Precondition failed: UID in precondition: {self.precondition_uid}, UID in "
                    f"object meta: {meta['uid']}"
                ),
            )
        if self.precondition_rv and self.precondition_rv != meta["resourceVersion"]:
            raise errors.conflict(
                resource,
                name,
                (
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{self.precondition_rv},"
                    f" ResourceVersion in object meta: {meta['resourceVersion']}"
                ),
            )


@dataclass
class DeleteOutcome:
    """What a delete left behind: the object (final or pending) and whether it is gone."""

    object: dict[str, Any]
    finished: bool
    warnings: list[str] = field(default_factory=list)
