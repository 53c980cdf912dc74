"""Firewall rules and their operations (`compute.googleapis.com/compute/v1`).

Rules are kept as compute returns them (`kind`, `id`, `creationTimestamp`, `selfLink`,
`network` as a full URL, `direction` INGRESS and `priority` 1000 by default). The project has
one network, `default`. Every write answers an Operation that is already `DONE` (the python
client's `.result()` then never polls; it would poll Google itself, since its operations
client ignores `api_endpoint`).

Errors use compute's dialect: inserting a name that exists is 409 `alreadyExists`, a missing
rule 404 `notFound`, a refused permission 403 `forbidden`.

`fingerprint` is the emulator's addition, not compute's (the real Firewall resource has none,
and the python client drops it): every write changes it, and a PATCH or PUT whose body carries
a different one is refused with 412 `conditionNotMet`, for tests of a client that guards its
read-modify-write. Without one, writes are last-writer-wins, as on Google Cloud.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from sandbox.gcp import errors
from sandbox.gcp.calls import Call, Json, Route, rfc3339
from sandbox.gcp.world import GcpWorld

SERVICE = "compute.googleapis.com"
NETWORK = "default"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_READ_ONLY = frozenset({"kind", "id", "creationTimestamp", "selfLink", "fingerprint", "name"})
_LISTS = ("sourceRanges", "destinationRanges", "targetTags", "sourceTags")


def _fingerprint() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


class Compute:
    """Global firewall rules and global operations of the emulated project."""

    def __init__(self, world: GcpWorld, persist: Callable[[], None]) -> None:
        self._world = world
        self._persist = persist

    def routes(self) -> list[Route]:
        project = "/compute/v1/projects/{project}/global"
        rules, rule = project + "/firewalls", project + "/firewalls/{firewall}"
        operation = project + "/operations/{operation}"

        def route(method: str, path: str, permission: str, handler: Any) -> Route:
            return Route(method, path, permission, handler, SERVICE, "compute")

        return [
            route("GET", rules, "compute.firewalls.list", self._list),
            route("POST", rules, "compute.firewalls.create", self._insert),
            route("GET", rule, "compute.firewalls.get", self._get),
            route("PATCH", rule, "compute.firewalls.update", self._patch),
            route("PUT", rule, "compute.firewalls.update", self._update),
            route("DELETE", rule, "compute.firewalls.delete", self._delete),
            route("GET", operation, "compute.globalOperations.get", self._operation),
            route("POST", operation + "/wait", "compute.globalOperations.get", self._operation),
        ]

    # -- handlers ----------------------------------------------------------------------------

    def _list(self, call: Call) -> Json:
        project = call.params["project"]
        return {
            "kind": "compute#firewallList",
            "id": f"projects/{project}/global/firewalls",
            "items": [self._world.firewalls[n] for n in sorted(self._world.firewalls)],
            "selfLink": f"{self._base(call)}/global/firewalls",
        }

    def _get(self, call: Call) -> Json:
        return self._rule(call)

    def _insert(self, call: Call) -> Json:
        body = call.body
        name = str(body.get("name", ""))
        if not _NAME.match(name):
            raise errors.invalid_argument(
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
            )
        if name in self._world.firewalls:
            raise errors.already_exists(
                f"The resource 'projects/{call.params['project']}/global/firewalls/{name}' "
                "already exists"
            )
        rule: Json = {
            "kind": "compute#firewall",
            "id": self._world.new_id(),
            "creationTimestamp": rfc3339(),
            "name": name,
            "network": self._network(call, body.get("network")),
            "priority": 1000,
            "direction": "INGRESS",
            "logConfig": {"enable": False},
            "disabled": False,
            "selfLink": f"{self._base(call)}/global/firewalls/{name}",
        }
        self._apply(rule, body)
        return self._write(call, rule, "insert")

    def _patch(self, call: Call) -> Json:
        rule = dict(self._rule(call))
        self._check_fingerprint(rule, call.body)
        network = call.body.get("network")
        if network is not None and self._network(call, network) != rule["network"]:
            raise errors.invalid_argument("Invalid value for field 'resource.network'.")
        self._apply(rule, call.body)
        return self._write(call, rule, "patch")

    def _update(self, call: Call) -> Json:
        old = self._rule(call)
        self._check_fingerprint(old, call.body)
        rule = {k: old[k] for k in ("kind", "id", "creationTimestamp", "name", "selfLink")}
        rule.update({"network": old["network"], "priority": 1000, "direction": "INGRESS"})
        rule.update({"logConfig": {"enable": False}, "disabled": False})
        self._apply(rule, call.body)
        return self._write(call, rule, "update")

    def _delete(self, call: Call) -> Json:
        rule = self._rule(call)
        del self._world.firewalls[rule["name"]]
        self._persist()
        return self._done(call, rule, "delete")

    def _operation(self, call: Call) -> Json:
        name = f"projects/{call.params['project']}/global/operations/{call.params['operation']}"
        found = self._world.operation(name)
        if found is None:
            raise errors.not_found(f"The resource '{name}' was not found")
        return found[1]

    # -- helpers -----------------------------------------------------------------------------

    def _base(self, call: Call) -> str:
        return f"{call.base_url}/compute/v1/projects/{call.params['project']}"

    def _rule(self, call: Call) -> Json:
        rule = self._world.firewalls.get(call.params["firewall"])
        if rule is None:
            raise errors.not_found(
                f"The resource 'projects/{call.params['project']}/global/firewalls/"
                f"{call.params['firewall']}' was not found"
            )
        return rule

    def _network(self, call: Call, given: Any) -> str:
        name = str(given or f"global/networks/{NETWORK}").rstrip("/").rsplit("/", 1)[-1]
        if name != NETWORK:
            raise errors.not_found(
                f"The resource 'projects/{call.params['project']}/global/networks/{name}' "
                "was not found"
            )
        return f"{self._base(call)}/global/networks/{NETWORK}"

    @staticmethod
    def _check_fingerprint(rule: Json, body: Json) -> None:
        given = body.get("fingerprint")
        if given and given != rule.get("fingerprint"):
            raise errors.condition_not_met(
                "Invalid fingerprint: the rule changed since it was read; read it again."
            )

    @staticmethod
    def _apply(rule: Json, body: Json) -> None:
        for field, value in body.items():
            if field in _READ_ONLY or field == "network":
                continue
            if field in _LISTS and not isinstance(value, list):
                raise errors.invalid_argument(f"Invalid value for field 'resource.{field}'.")
            rule[field] = value
        for index, cidr in enumerate(rule.get("sourceRanges", [])):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise errors.invalid_argument(
                    f"Invalid value for field 'resource.sourceRanges[{index}]': '{cidr}'. "
                    "Must be a CIDR address range that is contained in the network."
                ) from None
        if not rule.get("allowed") and not rule.get("denied"):
            raise errors.invalid_argument(
                "Invalid value for field 'resource': a firewall rule needs allowed or denied."
            )

    def _write(self, call: Call, rule: Json, kind: str) -> Json:
        rule["fingerprint"] = _fingerprint()
        self._world.firewalls[rule["name"]] = rule
        self._persist()
        return self._done(call, rule, kind)

    def _done(self, call: Call, rule: Json, kind: str) -> Json:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(8)}"
        now = rfc3339()
        operation: Json = {
            "kind": "compute#operation",
            "id": self._world.new_id(),
            "name": name,
            "operationType": kind,
            "targetLink": rule["selfLink"],
            "targetId": rule["id"],
            "status": "DONE",
            "user": call.actor,
            "progress": 100,
            "insertTime": now,
            "startTime": now,
            "endTime": now,
            "selfLink": f"{self._base(call)}/global/operations/{name}",
        }
        key = f"projects/{call.params['project']}/global/operations/{name}"
        self._world.operations[key] = ("compute", operation)
        return operation
