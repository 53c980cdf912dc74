"""Artifact Registry repositories (`artifactregistry.googleapis.com/v1`).

CreateRepository (`POST .../repositories?repositoryId=<id>`) answers a long-running Operation
(`projects/*/locations/*/operations/*`) that is already `done`, its `response` the Repository
with its `@type`, so the python client's `.result()` returns at once and gcloud stops polling
after one read. A repository holds no images here: pulls are the sandbox's image registry's
business (`registryUri` is where they would come from).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from sandbox.gcp import errors
from sandbox.gcp.calls import Call, Json, Route, rfc3339
from sandbox.gcp.world import GcpWorld

SERVICE = "artifactregistry.googleapis.com"
_TYPES = "type.googleapis.com/google.devtools.artifactregistry.v1."
_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
# Repository.Format and .Mode by number, for clients that send numeric enums.
_FORMATS = {1: "DOCKER", 2: "MAVEN", 3: "NPM", 5: "APT", 6: "YUM", 8: "PYTHON", 10: "GO"}
_MODES = {1: "STANDARD_REPOSITORY", 2: "VIRTUAL_REPOSITORY", 3: "REMOTE_REPOSITORY"}
_HOSTS = {"DOCKER": "docker", "MAVEN": "maven", "NPM": "npm", "PYTHON": "python", "GO": "go"}


def _enum(value: Any, names: dict[int, str]) -> str:
    if isinstance(value, int):
        return names.get(value, "")
    return str(value or "")


def _mode(value: Any) -> str:
    mode = _enum(value, _MODES)
    return "STANDARD_REPOSITORY" if mode in ("", "MODE_UNSPECIFIED") else mode


class ArtifactRegistry:
    """Repositories of the emulated project and the operations that created them."""

    def __init__(self, world: GcpWorld, persist: Callable[[], None]) -> None:
        self._world = world
        self._persist = persist

    def routes(self) -> list[Route]:
        repositories = "/v1/projects/{project}/locations/{location}/repositories"
        return [
            Route("GET", repositories, "artifactregistry.repositories.list", self._list, SERVICE),
            Route(
                "POST", repositories, "artifactregistry.repositories.create", self._create, SERVICE
            ),
            Route(
                "GET",
                repositories + "/{repository}",
                "artifactregistry.repositories.get",
                self._get,
                SERVICE,
            ),
            Route(
                "DELETE",
                repositories + "/{repository}",
                "artifactregistry.repositories.delete",
                self._delete,
                SERVICE,
            ),
        ]

    def _list(self, call: Call) -> Json:
        location = call.params["location"]
        found = [r for (loc, _), r in sorted(self._world.repositories.items()) if loc == location]
        return {"repositories": found}

    def _get(self, call: Call) -> Json:
        return self._repository(call)

    def _create(self, call: Call) -> Json:
        project, location = call.params["project"], call.params["location"]
        repository_id = call.query.get("repositoryId", "")
        if not _ID.match(repository_id):
            raise errors.invalid_argument(
                f"Invalid repository id {repository_id!r}: lowercase letters, digits and "
                "hyphens, starting with a letter."
            )
        if (location, repository_id) in self._world.repositories:
            raise errors.already_exists(
                f"the repository already exists: projects/{project}/locations/{location}/"
                f"repositories/{repository_id}"
            )
        kind = _enum(call.body.get("format"), _FORMATS)
        if not kind or kind == "FORMAT_UNSPECIFIED":
            raise errors.invalid_argument("Repository format must be specified.")
        now = rfc3339()
        repository: Json = {
            "name": f"projects/{project}/locations/{location}/repositories/{repository_id}",
            "format": kind,
            "description": str(call.body.get("description", "")),
            "labels": dict(call.body.get("labels") or {}),
            "createTime": now,
            "updateTime": now,
            "mode": _mode(call.body.get("mode")),
            "sizeBytes": "0",
            "registryUri": (
                f"{location}-{_HOSTS.get(kind, kind.lower())}.pkg.dev/{project}/{repository_id}"
            ),
        }
        self._world.repositories[(location, repository_id)] = repository
        self._persist()
        return self._done(call, {"@type": _TYPES + "Repository", **repository})

    def _delete(self, call: Call) -> Json:
        self._repository(call)
        del self._world.repositories[(call.params["location"], call.params["repository"])]
        self._persist()
        return self._done(call, {"@type": "type.googleapis.com/google.protobuf.Empty"})

    def _repository(self, call: Call) -> Json:
        found = self._world.repositories.get((call.params["location"], call.params["repository"]))
        if found is None:
            raise errors.not_found("Requested entity was not found.")
        return found

    def _done(self, call: Call, response: Json) -> Json:
        project, location = call.params["project"], call.params["location"]
        name = f"projects/{project}/locations/{location}/operations/{uuid.uuid4()}"
        operation: Json = {
            "name": name,
            "metadata": {"@type": _TYPES + "OperationMetadata"},
            "done": True,
            "response": response,
        }
        self._world.operations[name] = ("artifactregistry", operation)
        return operation
