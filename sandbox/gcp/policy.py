"""The project and its IAM policy (`cloudresourcemanager.googleapis.com`, v1 as gcloud calls it,
v3 as `resourcemanager_v3.ProjectsClient` does).

The policy's `serviceAccount:` members ARE the sandbox's `AccessPolicy.role_bindings`: reading
the policy shows every binding the sandbox holds (scenario, minted keys, `/_sandbox/access`),
and setIamPolicy grants and revokes there, so binding `roles/container.developer` to a new
account is what lets its key call the Kubernetes API. Other members (`user:`, `group:` ...)
are kept in the world and only shown. Conditions are not modelled (policy version 1).

The etag is a digest of the bindings, so any change to them, by whatever means, makes an
older etag stale: setIamPolicy with a stale etag answers 409 ABORTED, as Google does when
another read-modify-write got there first.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable

from sandbox.access import AccessPolicy
from sandbox.gcp import errors
from sandbox.gcp.calls import Call, Json, Route
from sandbox.gcp.iam import split_email
from sandbox.gcp.world import GcpWorld

SERVICE = "cloudresourcemanager.googleapis.com"
SERVICE_ACCOUNT = "serviceAccount:"
GET_PROJECT = "resourcemanager.projects.get"
_MEMBER_KINDS = ("user:", "group:", "domain:", "principal:", "principalSet:", "deleted:")
_PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
CONCURRENT_CHANGE = (
    "There were concurrent policy changes. Please retry the whole read-modify-write with "
    "exponential backoff."
)


class ProjectPolicy:
    """The project's resource and IAM policy, over the sandbox's role bindings."""

    def __init__(self, world: GcpWorld, access: AccessPolicy, persist: Callable[[], None]) -> None:
        self._world = world
        self._access = access
        self._persist = persist

    def bindings(self) -> dict[str, set[str]]:
        """role -> members, service accounts from the sandbox's bindings."""
        by_role: dict[str, set[str]] = {r: set(m) for r, m in self._world.other_members.items()}
        for email, roles in self._access.role_bindings.items():
            for role in roles:
                by_role.setdefault(role, set()).add(SERVICE_ACCOUNT + email)
        return {role: members for role, members in by_role.items() if members}

    def policy(self) -> Json:
        bindings = [
            {"role": role, "members": sorted(members)}
            for role, members in sorted(self.bindings().items())
        ]
        return {"version": 1, "etag": self._etag(bindings), "bindings": bindings}

    def set_policy(self, policy: Json) -> Json:
        """Replaces the bindings with `policy`'s; ABORTED if its etag is stale."""
        current = self.policy()
        etag = policy.get("etag")
        if etag and etag != current["etag"]:
            raise errors.aborted(CONCURRENT_CHANGE)
        accounts: dict[str, set[str]] = {}
        others: dict[str, set[str]] = {}
        known = {m for b in current["bindings"] for m in b["members"]}
        for binding in policy.get("bindings") or []:
            role = str(binding.get("role", ""))
            if not role.startswith(("roles/", "projects/", "organizations/")):
                raise errors.invalid_argument(f"Role ({role}) does not exist in the resource.")
            for member in binding.get("members") or []:
                self._check_member(str(member), known)
                if member.startswith(SERVICE_ACCOUNT):
                    accounts.setdefault(member.removeprefix(SERVICE_ACCOUNT), set()).add(role)
                else:
                    others.setdefault(role, set()).add(str(member))
        for email in set(self._access.role_bindings) | set(accounts):
            wanted = accounts.get(email, set())
            if self._access.role_bindings.get(email, set()) == wanted:
                continue
            self._access.revoke(email)
            for role in wanted:
                self._access.grant(email, role)
            self._world.api_roles[email] = sorted(wanted)
        self._world.other_members = others
        self._persist()
        return self.policy()

    def restore(self) -> None:
        """Applies the roles setIamPolicy decided before a restart."""
        for email, roles in self._world.api_roles.items():
            self._access.revoke(email)
            for role in roles:
                self._access.grant(email, role)

    def _check_member(self, member: str, known: set[str]) -> None:
        if member in known or member in _PUBLIC_MEMBERS:
            return
        if member.startswith(SERVICE_ACCOUNT):
            email = member.removeprefix(SERVICE_ACCOUNT)
            parts = split_email(email)
            if parts is None or parts[1] != self._world.project:
                return  # another project's account or a Google-managed one: not checked
            if email not in self._world.service_accounts:
                raise errors.invalid_argument(f"Service account {email} does not exist.")
            return
        if not member.startswith(_MEMBER_KINDS):
            raise errors.invalid_argument(f"Invalid member type in {member!r}.")

    @staticmethod
    def _etag(bindings: list[Json]) -> str:
        digest = hashlib.sha256(json.dumps(bindings, sort_keys=True).encode()).digest()
        return base64.b64encode(b"\x07" + digest[:7]).decode()

    # -- the API -----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        out: list[Route] = []
        for version in ("v1", "v3"):
            project = f"/{version}/projects/{{project:[^/:]+}}"
            out += [
                Route(
                    "POST",
                    project + ":getIamPolicy",
                    "resourcemanager.projects.getIamPolicy",
                    lambda _call: self.policy(),
                    SERVICE,
                ),
                Route(
                    "POST",
                    project + ":setIamPolicy",
                    "resourcemanager.projects.setIamPolicy",
                    self._set,
                    SERVICE,
                ),
            ]
        out += [
            Route("GET", "/v1/projects/{project:[^/:]+}", GET_PROJECT, self._project_v1, SERVICE),
            Route("GET", "/v3/projects/{project:[^/:]+}", GET_PROJECT, self._project_v3, SERVICE),
        ]
        return out

    def _set(self, call: Call) -> Json:
        policy = call.body.get("policy")
        if not isinstance(policy, dict):
            raise errors.invalid_argument("setIamPolicy needs a policy.")
        return self.set_policy(policy)

    def _project_v1(self, call: Call) -> Json:
        return {
            "projectNumber": self._world.project_number,
            "projectId": self._world.project,
            "lifecycleState": "ACTIVE",
            "name": self._world.project,
        }

    def _project_v3(self, call: Call) -> Json:
        return {
            "name": f"projects/{self._world.project_number}",
            "projectId": self._world.project,
            "state": "ACTIVE",
            "displayName": self._world.project,
        }
