"""The Google Cloud project the emulator serves: what its APIs created, and what survives a
restart.

Shared with the Kubernetes API rather than copied here: the cluster's authorized networks and
the project's service-account role bindings live in the sandbox's `AccessPolicy`; the node
pools are the cluster's nodes; key material is the sandbox's `Authenticator`'s. This object
holds the rest: service accounts, key metadata, firewall rules, repositories, operations,
display names of authorized networks and the IAM members that are not service accounts.

Persistence (`save`/`load`, a JSON file in the sandbox state directory) keeps the resources
and the changes made through these APIs (authorized networks set by UpdateCluster, the roles
of accounts a setIamPolicy touched), so a rerun of the attach step after a restart finds what
the first run made. Changes made by other means (the scenario, `/_sandbox/access`) are the
sandbox's own and are not recorded here.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from levers9.files import write_private
from sandbox.gcp.calls import Json

SERVICE_ACCOUNT_DOMAIN = "iam.gserviceaccount.com"


@dataclass
class ServiceAccount:
    project: str
    account_id: str
    unique_id: str
    display_name: str = ""
    description: str = ""

    @property
    def email(self) -> str:
        return f"{self.account_id}@{self.project}.{SERVICE_ACCOUNT_DOMAIN}"

    @property
    def name(self) -> str:
        return f"projects/{self.project}/serviceAccounts/{self.email}"


@dataclass
class KeyInfo:
    """A user-managed key's public facts (the private half is never kept here)."""

    key_id: str
    email: str
    valid_after: str

    def name(self, project: str) -> str:
        return f"projects/{project}/serviceAccounts/{self.email}/keys/{self.key_id}"


@dataclass
class GcpWorld:
    """Everything the emulated project holds beyond the sandbox's shared parts."""

    project: str
    service_accounts: dict[str, ServiceAccount] = field(default_factory=dict)
    keys: dict[str, KeyInfo] = field(default_factory=dict)
    firewalls: dict[str, Json] = field(default_factory=dict)
    # (location, repository id) -> Repository JSON.
    repositories: dict[tuple[str, str], Json] = field(default_factory=dict)
    # operation name (`projects/p/locations/l/operations/x`, `.../global/operations/x`) ->
    # (kind, JSON); container and artifact registry share the `locations/*/operations` path.
    operations: dict[str, tuple[str, Json]] = field(default_factory=dict)
    # role -> members that are not service accounts (`user:`, `group:` ...).
    other_members: dict[str, set[str]] = field(default_factory=dict)
    network_names: dict[str, str] = field(default_factory=dict)
    # What UpdateCluster set last (None: turned off); absent until it ran once.
    api_networks: list[str] | None = None
    api_networks_set: bool = False
    # Service accounts whose roles a setIamPolicy decided, with the roles it left them.
    api_roles: dict[str, list[str]] = field(default_factory=dict)

    @property
    def project_number(self) -> str:
        """The project's number, stable for its id (APIs accept either)."""
        digest = hashlib.sha256(self.project.encode()).digest()
        return str(10**11 + int.from_bytes(digest[:8], "big") % (9 * 10**11))

    @staticmethod
    def new_id(digits: int = 19) -> str:
        """A numeric id as Google gives resources."""
        return str(10 ** (digits - 1) + secrets.randbelow(9 * 10 ** (digits - 1)))

    def operation(self, name: str) -> tuple[str, Json] | None:
        return self.operations.get(name)

    # -- persistence -------------------------------------------------------------------------

    def save(self, path: Path | None) -> None:
        if path is None:
            return
        record: dict[str, Any] = {
            "serviceAccounts": [asdict(a) for a in self.service_accounts.values()],
            "keys": [asdict(k) for k in self.keys.values()],
            "firewalls": list(self.firewalls.values()),
            "repositories": [
                {"location": loc, "id": rid, "repository": repo}
                for (loc, rid), repo in self.repositories.items()
            ],
            "otherMembers": {role: sorted(m) for role, m in self.other_members.items() if m},
            "networkNames": self.network_names,
            "apiRoles": self.api_roles,
        }
        if self.api_networks_set:
            record["apiNetworks"] = self.api_networks
        write_private(path, json.dumps(record, indent=2) + "\n")

    def load(self, path: Path | None) -> None:
        if path is None or not path.exists():
            return
        record = json.loads(path.read_text())
        for account in record.get("serviceAccounts", []):
            loaded = ServiceAccount(**account)
            self.service_accounts[loaded.email] = loaded
        for key in record.get("keys", []):
            info = KeyInfo(**key)
            self.keys[info.key_id] = info
        for firewall in record.get("firewalls", []):
            self.firewalls[firewall["name"]] = firewall
        for entry in record.get("repositories", []):
            self.repositories[(entry["location"], entry["id"])] = entry["repository"]
        self.other_members = {r: set(m) for r, m in record.get("otherMembers", {}).items()}
        self.network_names = dict(record.get("networkNames", {}))
        self.api_roles = {e: list(r) for e, r in record.get("apiRoles", {}).items()}
        if "apiNetworks" in record:
            self.api_networks = record["apiNetworks"]
            self.api_networks_set = True
