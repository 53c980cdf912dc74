"""core/v1 Events, as the scheduler, kubelets and controllers record them for `kubectl
describe` and `kubectl get events`.

Repeats of the same event (same object, type, reason and message) update one Event's `count`
and `lastTimestamp`, as client-go's event correlator does, instead of piling up objects.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from levers9.logs import get_logger
from sandbox import errors
from sandbox.cluster.objects import meta
from sandbox.resources import EVENTS
from sandbox.store import rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

log = get_logger("sandbox.events")

_REMEMBERED = 4096  # correlation keys kept; older repeats start a new Event, as client-go's LRU


class EventRecorder:
    """Records Events for one component (`default-scheduler`, `kubelet` on a host, ...)."""

    def __init__(self, registry: Registry, component: str, host: str | None = None) -> None:
        self._registry = registry
        self._component = component
        self._host = host
        self._seen: OrderedDict[tuple[str, str, str, str], str] = OrderedDict()

    def normal(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.record(obj, "Normal", reason, message)

    def warning(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.record(obj, "Warning", reason, message)

    def record(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Writes (or bumps) the Event; failures are logged, never raised: an Event is a
        best-effort note, and a controller must not fail its sync over one."""
        m = meta(obj)
        namespace = str(m.get("namespace") or "default")
        key = (str(m.get("uid", "")), kind, reason, message)
        now = rfc3339(self._registry.store.now())
        try:
            name = self._seen.get(key)
            if name is not None and self._bump(namespace, name, now):
                self._seen.move_to_end(key)
                return
            name = f"{m.get('name', '')}.{secrets.token_hex(8)}"
            self._registry.create(
                EVENTS, self._event(obj, name, namespace, kind, reason, message, now)
            )
        except errors.ApiError as error:
            log.debug("event not recorded", reason=reason, code=error.code)
            return
        self._seen[key] = name
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)

    def _bump(self, namespace: str, name: str, now: str) -> bool:
        try:
            event = self._registry.get(EVENTS, namespace, name)
        except errors.ApiError:
            return False
        event["count"] = int(event.get("count") or 1) + 1
        event["lastTimestamp"] = now
        self._registry.replace(EVENTS, event)
        return True

    def _event(
        self,
        obj: Mapping[str, Any],
        name: str,
        namespace: str,
        kind: str,
        reason: str,
        message: str,
        now: str,
    ) -> dict[str, Any]:
        m = meta(obj)
        involved = {
            "kind": obj.get("kind", ""),
            "namespace": m.get("namespace"),
            "name": m.get("name"),
            "uid": m.get("uid"),
            "apiVersion": obj.get("apiVersion", ""),
            "resourceVersion": m.get("resourceVersion"),
        }
        source = {"component": self._component}
        if self._host:
            source["host"] = self._host
        return {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v is not None},
            "reason": reason,
            "message": message,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": kind,
            "eventTime": None,
            "reportingComponent": self._component,
            "reportingInstance": self._host or "",
        }
