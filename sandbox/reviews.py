"""What a caller may ask the API about itself: `kubectl auth whoami` and `kubectl auth can-i`.

Three create-only kinds, answered and never stored, open to every authenticated caller (as
`system:basic-user` opens them on a cluster):

- `authentication.k8s.io/v1` SelfSubjectReview: `status.userInfo` (username, groups);
- `authorization.k8s.io/v1` SelfSubjectAccessReview: `spec.resourceAttributes` (namespace,
  verb, group, resource, subresource, name) or `spec.nonResourceAttributes` (path, verb) ->
  `status.allowed`, decided as the request itself would be: RBAC for service accounts
  (`rbac`), IAM roles for GKE identities (`access`), allowed for the admin;
- `authorization.k8s.io/v1` SelfSubjectRulesReview: `spec.namespace` -> the RBAC rules a
  service account holds there (`kubectl auth can-i --list`); the admin holds `*`; for a GKE
  identity the rules are IAM's and the review says it is `incomplete`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from sandbox import errors
from sandbox.auth import Principal
from sandbox.handlers import json_response, read_body
from sandbox.rbac import Attributes, RbacAuthorizer
from sandbox.resources import (
    SELF_SUBJECT_ACCESS_REVIEWS,
    SELF_SUBJECT_REVIEWS,
    SELF_SUBJECT_RULES_REVIEWS,
    Resource,
)
from sandbox.routing import RequestInfo

if TYPE_CHECKING:
    from sandbox.apiserver import ApiServerParts

REVIEWS = (SELF_SUBJECT_REVIEWS, SELF_SUBJECT_ACCESS_REVIEWS, SELF_SUBJECT_RULES_REVIEWS)
_EVERYTHING = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}


def is_review(info: RequestInfo) -> bool:
    return info.resource in REVIEWS


class Reviews:
    """Answers the self-reviews of `REVIEWS` for the caller (see module doc)."""

    def __init__(self, parts: ApiServerParts, rbac: RbacAuthorizer) -> None:
        self._parts = parts
        self._rbac = rbac

    async def answer(
        self, request: web.Request, info: RequestInfo, principal: Principal
    ) -> web.Response:
        resource = info.resource
        assert resource is not None
        if info.verb != "create" or info.name is not None or info.subresource is not None:
            raise errors.method_not_allowed()
        body = await read_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not an object")
        spec = body.get("spec") or {}
        if resource is SELF_SUBJECT_REVIEWS:
            status: dict[str, Any] = {
                "userInfo": {"username": principal.username, "groups": self._groups(principal)}
            }
        elif resource is SELF_SUBJECT_ACCESS_REVIEWS:
            status = {"allowed": self._allowed(principal, spec)}
        else:
            status = self._rules(principal, str(spec.get("namespace") or ""))
        return json_response(_answer(resource, body, status), 201)

    @staticmethod
    def _groups(principal: Principal) -> list[str]:
        return list(principal.groups) or ["system:authenticated"]

    def _allowed(self, principal: Principal, spec: dict[str, Any]) -> bool:
        resource_attrs = spec.get("resourceAttributes")
        non_resource = spec.get("nonResourceAttributes")
        if resource_attrs is None and non_resource is None:
            raise errors.unprocessable(
                'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: '
                'spec.resourceAttributes: Invalid value: "null": exactly one of '
                "nonResourceAttributes or resourceAttributes must be specified"
            )
        if resource_attrs is not None:
            attrs = Attributes(
                verb=str(resource_attrs.get("verb") or ""),
                namespace=str(resource_attrs.get("namespace") or ""),
                group=str(resource_attrs.get("group") or ""),
                resource=str(resource_attrs.get("resource") or ""),
                subresource=str(resource_attrs.get("subresource") or ""),
                name=str(resource_attrs.get("name") or ""),
            )
            version = str(resource_attrs.get("version") or "")
        else:
            non_resource = non_resource or {}
            attrs = Attributes(
                verb=str(non_resource.get("verb") or ""),
                path=str(non_resource.get("path") or ""),
                resource_request=False,
            )
            version = ""
        if principal.in_cluster:
            return self._rbac.allows(principal, attrs)[0]
        if principal.superuser or not attrs.resource_request:
            return True
        catalog = self._parts.registry.catalog
        found = next(
            (
                r
                for r in catalog
                if r.group == attrs.group
                and r.plural == attrs.resource
                and (not version or r.version == version)
            ),
            None,
        )
        info = RequestInfo(
            verb=attrs.verb,
            path="",
            is_resource_request=True,
            group=attrs.group,
            version=version,
            resource_name=attrs.resource,
            resource=found,
            namespace=attrs.namespace or None,
            name=attrs.name or None,
            subresource=attrs.subresource or None,
        )
        try:
            self._parts.policy.authorize(principal, info)
        except errors.ApiError:
            return False
        return True

    def _rules(self, principal: Principal, namespace: str) -> dict[str, Any]:
        if principal.in_cluster:
            rules, problems = self._rbac.rules(principal, namespace)
        elif principal.superuser:
            rules, problems = [_EVERYTHING, {"verbs": ["*"], "nonResourceURLs": ["*"]}], []
        else:
            return {
                "resourceRules": [],
                "nonResourceRules": [],
                "incomplete": True,
                "evaluationError": "the caller is authorized by IAM roles, which are not listed",
            }
        resource_rules = []
        non_resource_rules = []
        for rule in rules:
            if rule.get("nonResourceURLs"):
                non_resource_rules.append(
                    {"verbs": list(rule["verbs"]), "nonResourceURLs": list(rule["nonResourceURLs"])}
                )
            else:
                entry = {
                    "verbs": list(rule.get("verbs") or ()),
                    "apiGroups": list(rule.get("apiGroups") or ()),
                    "resources": list(rule.get("resources") or ()),
                }
                if rule.get("resourceNames"):
                    entry["resourceNames"] = list(rule["resourceNames"])
                resource_rules.append(entry)
        status: dict[str, Any] = {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": bool(problems),
        }
        if problems:
            status["evaluationError"] = "; ".join(problems)
        return status


def _answer(resource: Resource, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": resource.kind,
        "apiVersion": resource.api_version,
        "metadata": {"creationTimestamp": None},
    }
    if resource is not SELF_SUBJECT_REVIEWS:
        out["spec"] = body.get("spec") or {}
    out["status"] = status
    return out
