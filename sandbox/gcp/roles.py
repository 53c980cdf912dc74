"""Which IAM roles grant which Google Cloud permissions, for the calls the emulator serves.

Basic roles: `roles/owner` and `roles/editor` grant every permission here (on Google Cloud an
editor cannot change IAM policy; the emulator does not draw that line), `roles/viewer` every
`get` and `list`. The predefined roles below are the ones an attach step's service account is
plausibly given; a role not listed grants nothing. The Kubernetes API's own mapping (what
`roles/container.developer` lets a caller do inside the cluster) is `access.iam_permission`.
"""

from __future__ import annotations

from collections.abc import Iterable

OWNER = "roles/owner"
EDITOR = "roles/editor"
VIEWER = "roles/viewer"

_READ_VERBS = ("get", "list", "getIamPolicy")
# role -> permission prefixes it grants (`service.resource.` or a whole permission).
_PREDEFINED: dict[str, tuple[str, ...]] = {
    "roles/container.admin": ("container.",),
    "roles/container.clusterAdmin": ("container.clusters.", "container.operations."),
    "roles/container.developer": ("container.clusters.get", "container.clusters.list"),
    "roles/container.viewer": (
        "container.clusters.get",
        "container.clusters.list",
        "container.operations.",
    ),
    "roles/compute.admin": ("compute.",),
    "roles/compute.securityAdmin": ("compute.firewalls.", "compute.globalOperations."),
    "roles/compute.networkAdmin": (
        "compute.firewalls.get",
        "compute.firewalls.list",
        "compute.globalOperations.",
    ),
    "roles/iam.serviceAccountAdmin": ("iam.serviceAccounts.",),
    "roles/iam.serviceAccountKeyAdmin": ("iam.serviceAccountKeys.", "iam.serviceAccounts.get"),
    "roles/resourcemanager.projectIamAdmin": (
        "resourcemanager.projects.getIamPolicy",
        "resourcemanager.projects.setIamPolicy",
    ),
    "roles/artifactregistry.admin": ("artifactregistry.",),
    "roles/artifactregistry.reader": (
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.list",
        "artifactregistry.repositories.downloadArtifacts",
    ),
}


def role_grants(role: str, permission: str) -> bool:
    """Whether `role` grants `permission` (`container.clusters.update` ...)."""
    if role in (OWNER, EDITOR):
        return True
    if role == VIEWER:
        return permission.rsplit(".", 1)[-1] in _READ_VERBS
    return any(
        permission == prefix or (prefix.endswith(".") and permission.startswith(prefix))
        for prefix in _PREDEFINED.get(role, ())
    )


def any_grants(roles: Iterable[str], permission: str) -> bool:
    return any(role_grants(role, permission) for role in roles)
