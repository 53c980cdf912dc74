"""A client for a running sandbox's admin API (scenario commands, access, faults, counters).

It finds the sandbox by its state directory (`sandbox.json`, `admin-token`, `ca.crt`), so the
CLI and the tests drive a sandbox in another process exactly as a user would.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TIMEOUT_S = 30.0


class SandboxUnavailable(Exception):
    """No sandbox answers at the state directory's address."""


class SandboxAdminError(Exception):
    """The sandbox refused a command; the message is its Status message."""


class SandboxAdmin:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        try:
            info = json.loads((state_dir / "sandbox.json").read_text())
            self.token = (state_dir / "admin-token").read_text().strip()
        except (OSError, ValueError):
            raise SandboxUnavailable(
                f"no sandbox state at {state_dir}: start one with `levers9 dev up`"
                " or `levers9 sandbox serve`"
            ) from None
        self.url: str = info["url"]
        self._tls = ssl.create_default_context(cafile=str(state_dir / "ca.crt"))

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self._tls) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            try:
                message = json.loads(error.read()).get("message", error.reason)
            except ValueError:
                message = error.reason
            raise SandboxAdminError(f"{method} {path}: {error.code} {message}") from None
        except (urllib.error.URLError, OSError) as error:
            raise SandboxUnavailable(
                f"the sandbox at {self.url} does not answer: {error}"
            ) from None

    def ready(self) -> bool:
        try:
            self.call("GET", "/_sandbox/nodes")
        except (SandboxUnavailable, SandboxAdminError):
            return False
        return True

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self.call("GET", "/_sandbox/nodes")["nodes"]
        return nodes

    def add_node(self, spec: dict[str, Any]) -> None:
        self.call("POST", "/_sandbox/nodes", spec)

    def remove_node(self, name: str) -> None:
        self.call("DELETE", f"/_sandbox/nodes/{name}")

    def preempt_node(self, name: str, notice_s: float) -> None:
        self.call("POST", f"/_sandbox/nodes/{name}/preempt", {"noticeSeconds": notice_s})

    def set_node_ready(self, name: str, ready: bool) -> None:
        self.call("PUT", f"/_sandbox/nodes/{name}/ready", {"ready": ready})

    def access(self) -> dict[str, Any]:
        access: dict[str, Any] = self.call("GET", "/_sandbox/access")
        return access

    def update_access(self, changes: dict[str, Any]) -> dict[str, Any]:
        access: dict[str, Any] = self.call("PATCH", "/_sandbox/access", changes)
        return access

    def add_fault(self, rule: dict[str, Any]) -> dict[str, Any]:
        added: dict[str, Any] = self.call("POST", "/_sandbox/faults", rule)
        return added

    def clear_faults(self) -> None:
        self.call("DELETE", "/_sandbox/faults")

    def requests(self) -> dict[str, Any]:
        counts: dict[str, Any] = self.call("GET", "/_sandbox/requests")
        return counts

    def reset_requests(self) -> None:
        self.call("DELETE", "/_sandbox/requests")

    def compact(self) -> str:
        """Drops all watch history and list snapshots; the resourceVersion it compacted at."""
        answer: dict[str, Any] = self.call("POST", "/_sandbox/compact", {})
        return str(answer["resourceVersion"])

    def drop_watches(self, *, graceful: bool = False) -> int:
        """Ends every open watch (connections reset unless `graceful`); how many."""
        answer: dict[str, Any] = self.call("POST", "/_sandbox/watches/drop", {"graceful": graceful})
        return int(answer["dropped"])

    def expire_tokens(self) -> int:
        """Expires every issued access token now; how many were valid."""
        answer: dict[str, Any] = self.call("POST", "/_sandbox/tokens/expire", {})
        return int(answer["expired"])
