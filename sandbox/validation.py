"""Validation the apiserver does before it stores an object, with its field paths and texts.

Failures become one 422 Invalid listing every cause, as `kubectl` prints it:
`The Pod "BAD" is invalid: metadata.name: Invalid value: "BAD": a lowercase RFC 1123 ...`.
Covered: object names (RFC 1123 subdomain or label, per type), label keys and values, pod
specs (containers, names, images, restart policy), job and deployment templates and selectors,
and the update rules clients trip over (pod spec and job template immutability, a Secret's
type, no new finalizer on an object being deleted). RBAC objects
(names are path segments: `system:aggregate-to-view` is valid): rules need verbs and either
resources with API groups or non-resource URLs (ClusterRoles only); bindings need a roleRef of a
kind they may bind, which never changes, and subjects of known kinds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from sandbox.errors import Cause
from sandbox.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    RBAC_GROUP,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    Resource,
)
from sandbox.selectors import LabelSelector

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?"
    "[A-Za-z0-9])?')"
)
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_POD_UPDATE_MSG = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
    "set to 1 if it was previously negative)"
)

Validator = Callable[[dict[str, Any]], list[Cause]]
UpdateValidator = Callable[[dict[str, Any], dict[str, Any]], list[Cause]]


def name_causes(resource: Resource, name: str, path: str = "metadata.name") -> list[Cause]:
    """Whether `name` is a valid object name for `resource` (a label for namespaces)."""
    if resource is NAMESPACES:
        if len(name) > 63:
            return [Cause.invalid(path, name, "must be no more than 63 characters")]
        return [] if _LABEL.match(name) else [Cause.invalid(path, name, LABEL_MSG)]
    causes = []
    if resource in (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS):
        # RBAC names are path segment names (`ValidateRBACName`).
        if name in (".", ".."):
            return [Cause.invalid(path, name, f"may not be '{name}'")]
        return [Cause.invalid(path, name, f"may not contain '{c}'") for c in "/%" if c in name]
    if len(name) > 253:
        causes.append(Cause.invalid(path, name, "must be no more than 253 characters"))
    if not _SUBDOMAIN.match(name):
        causes.append(Cause.invalid(path, name, SUBDOMAIN_MSG))
    if resource is JOBS and len(name) > 63:
        # The name becomes the `job-name` label of its pods, and label values stop at 63.
        causes.append(Cause.invalid(path, name, "must be no more than 63 characters"))
    return causes


def label_causes(labels: Any, path: str = "metadata.labels") -> list[Cause]:
    if labels is None:
        return []
    if not isinstance(labels, Mapping):
        return [Cause.invalid(path, str(labels), "must be a map of strings")]
    causes = []
    for key, value in labels.items():
        causes.extend(_qualified_name_causes(str(key), path))
        text = str(value)
        if len(text) > 63:
            causes.append(Cause.invalid(path, text, "must be no more than 63 characters"))
        elif not _LABEL_VALUE.match(text):
            causes.append(Cause.invalid(path, text, _LABEL_VALUE_MSG))
    return causes


def _qualified_name_causes(key: str, path: str) -> list[Cause]:
    prefix, slash, name = key.rpartition("/")
    causes = []
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        causes.append(Cause.invalid(path, key, _NAME_PART_MSG))
    if slash and (not prefix or not _SUBDOMAIN.match(prefix)):
        causes.append(Cause.invalid(path, key, "prefix part " + SUBDOMAIN_MSG))
    return causes


def metadata_causes(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    causes: list[Cause] = []
    if not name:
        causes.append(Cause.required("metadata.name", "name or generateName is required"))
    else:
        causes.extend(name_causes(resource, name))
    causes.extend(label_causes(meta.get("labels")))
    annotations = meta.get("annotations")
    if annotations is not None:
        for key in annotations:
            causes.extend(_qualified_name_causes(str(key), "metadata.annotations"))
    return causes


def pod_spec_causes(spec: Any, path: str, *, restart_policies: tuple[str, ...]) -> list[Cause]:
    if not isinstance(spec, Mapping):
        return [Cause.required(path)]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(Cause.required(f"{path}.containers"))
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            name = str(container.get("name") or "")
            if not name:
                causes.append(Cause.required(f"{where}.name"))
            elif not _LABEL.match(name) or len(name) > 63:
                causes.append(Cause.invalid(f"{where}.name", name, LABEL_MSG))
            elif name in seen:
                causes.append(Cause.duplicate(f"{where}.name", name))
            seen.add(name)
            if not container.get("image"):
                causes.append(Cause.required(f"{where}.image"))
    policy = spec.get("restartPolicy")
    if not policy:
        detail = "valid values: " + ", ".join(f'"{p}"' for p in restart_policies)
        causes.append(Cause.required(f"{path}.restartPolicy", detail))
    elif policy not in restart_policies:
        causes.append(Cause.unsupported(f"{path}.restartPolicy", policy, restart_policies))
    return causes


def _pod(obj: dict[str, Any]) -> list[Cause]:
    return pod_spec_causes(
        obj.get("spec"), "spec", restart_policies=("Always", "OnFailure", "Never")
    )


def _template_causes(obj: dict[str, Any], policies: tuple[str, ...]) -> list[Cause]:
    spec = obj.get("spec") or {}
    template = spec.get("template")
    if not isinstance(template, Mapping):
        return [Cause.required("spec.template")]
    tmeta = template.get("metadata") or {}
    causes = label_causes(tmeta.get("labels"), "spec.template.metadata.labels")
    causes.extend(
        pod_spec_causes(template.get("spec"), "spec.template.spec", restart_policies=policies)
    )
    return causes


def _selector_causes(spec: Mapping[str, Any]) -> list[Cause]:
    selector = spec.get("selector")
    if not selector:
        return [Cause.required("spec.selector")]
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not LabelSelector.from_object(selector).matches(labels):
        shown = "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in labels.items()) + "}"
        return [
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {shown}: `selector` does not match template `labels`",
                "spec.template.metadata.labels",
            )
        ]
    return []


def _deployment(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes = _template_causes(obj, ("Always",))
    causes.extend(_selector_causes(spec))
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        causes.append(
            Cause.invalid("spec.replicas", replicas, "must be greater than or equal to 0")
        )
    return causes


def _job(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes = _template_causes(obj, ("OnFailure", "Never"))
    causes.extend(_selector_causes(spec))
    for field in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds"):
        value = spec.get(field)
        if isinstance(value, int) and value < 0:
            causes.append(
                Cause.invalid(f"spec.{field}", value, "must be greater than or equal to 0")
            )
    return causes


def _secret(obj: dict[str, Any]) -> list[Cause]:
    return [
        Cause.invalid(
            f"data[{key}]",
            key,
            "a valid config key must consist of alphanumeric "
            "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or "
            "'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
        )
        for key in obj.get("data") or {}
        if not _CONFIG_KEY.match(str(key))
    ]


def _event(obj: dict[str, Any]) -> list[Cause]:
    involved = obj.get("involvedObject") or {}
    ns = (obj.get("metadata") or {}).get("namespace", "")
    target = involved.get("namespace")
    if target and target != ns:
        return [Cause.invalid("involvedObject.namespace", target, "does not match event.namespace")]
    return []


def _policy_rules(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    causes = []
    for i, rule in enumerate(obj.get("rules") or ()):
        path = f"rules[{i}]"
        if not isinstance(rule, Mapping):
            causes.append(Cause.invalid(path, str(rule), "must be a PolicyRule"))
            continue
        if not rule.get("verbs"):
            causes.append(Cause.required(f"{path}.verbs", "verbs must contain at least one value"))
        urls = rule.get("nonResourceURLs")
        if urls:
            if namespaced:
                detail = "namespaced rules cannot apply to non-resource URLs"
                causes.append(Cause.invalid(f"{path}.nonResourceURLs", urls, detail))
            if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                detail = "rules cannot apply to both regular resources and non-resource URLs"
                causes.append(Cause.invalid(f"{path}.nonResourceURLs", urls, detail))
            continue
        if not rule.get("apiGroups"):
            detail = "resource rules must supply at least one api group"
            causes.append(Cause.required(f"{path}.apiGroups", detail))
        if not rule.get("resources"):
            detail = "resource rules must supply at least one resource"
            causes.append(Cause.required(f"{path}.resources", detail))
    return causes


def _role_binding(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    causes = []
    ref = obj.get("roleRef") or {}
    kinds = ("Role", "ClusterRole") if namespaced else ("ClusterRole",)
    if ref.get("apiGroup") != RBAC_GROUP:
        causes.append(Cause.unsupported("roleRef.apiGroup", ref.get("apiGroup", ""), [RBAC_GROUP]))
    if ref.get("kind") not in kinds:
        causes.append(Cause.unsupported("roleRef.kind", ref.get("kind", ""), kinds))
    if not ref.get("name"):
        causes.append(Cause.required("roleRef.name"))
    for i, subject in enumerate(obj.get("subjects") or ()):
        path = f"subjects[{i}]"
        if not subject.get("name"):
            causes.append(Cause.required(f"{path}.name"))
        kind, group = subject.get("kind"), subject.get("apiGroup") or ""
        if kind == "ServiceAccount":
            if group:
                causes.append(Cause.unsupported(f"{path}.apiGroup", group, [""]))
            if not namespaced and not subject.get("namespace"):
                causes.append(Cause.required(f"{path}.namespace"))
        elif kind in ("User", "Group"):
            if group != RBAC_GROUP:
                causes.append(Cause.unsupported(f"{path}.apiGroup", group, [RBAC_GROUP]))
        else:
            subject_kinds = ("ServiceAccount", "User", "Group")
            causes.append(Cause.unsupported(f"{path}.kind", kind or "", subject_kinds))
    return causes


_CREATE: dict[Resource, Validator] = {
    PODS: _pod,
    DEPLOYMENTS: _deployment,
    JOBS: _job,
    SECRETS: _secret,
    EVENTS: _event,
    ROLES: lambda obj: _policy_rules(obj, True),
    CLUSTER_ROLES: lambda obj: _policy_rules(obj, False),
    ROLE_BINDINGS: lambda obj: _role_binding(obj, True),
    CLUSTER_ROLE_BINDINGS: lambda obj: _role_binding(obj, False),
}


def validate(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    """Every reason `obj` cannot be stored as a `resource`."""
    causes = metadata_causes(resource, obj)
    check = _CREATE.get(resource)
    if check is not None:
        causes.extend(check(obj))
    return causes


def _immutable(path: str, value: Any) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {_short(value)}: field is immutable", path)


def _short(value: Any) -> str:
    if isinstance(value, Mapping):
        return "core.PodTemplateSpec{...}" if "spec" in value else "v1.LabelSelector{...}"
    return str(value)


def _pod_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    before, after = dict(old.get("spec") or {}), dict(new.get("spec") or {})
    for spec in (before, after):
        for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
            spec.pop(field, None)
        for group in ("containers", "initContainers"):
            spec[group] = [{**c, "image": ""} for c in spec.get(group) or []]
    if before != after:
        return [Cause.forbidden("spec", _POD_UPDATE_MSG)]
    return []


def _job_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    before, after = old.get("spec") or {}, new.get("spec") or {}
    causes = []
    for field in ("selector", "template", "completionMode"):
        if before.get(field) != after.get(field):
            causes.append(_immutable(f"spec.{field}", after.get(field)))
    if before.get("completions") != after.get("completions"):
        causes.append(_immutable("spec.completions", after.get("completions")))
    return causes


def _deployment_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    before, after = old.get("spec") or {}, new.get("spec") or {}
    if before.get("selector") != after.get("selector"):
        return [_immutable("spec.selector", after.get("selector"))]
    return []


def _secret_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """`ValidateSecretUpdate`: the type never changes; an immutable Secret keeps its data."""
    causes = []
    if old.get("type") != new.get("type"):
        causes.append(Cause.invalid("type", new.get("type"), "field is immutable"))
    if old.get("immutable") is True:
        detail = "field is immutable when `immutable` is set"
        if new.get("immutable") is not True:
            causes.append(Cause.forbidden("immutable", detail))
        if (old.get("data") or {}) != (new.get("data") or {}):
            causes.append(Cause.forbidden("data", detail))
    return causes


def _finalizer_causes(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """`ValidateNoNewFinalizers`: an object being deleted may lose finalizers, not gain them."""
    if not (old.get("metadata") or {}).get("deletionTimestamp"):
        return []
    before = set((old.get("metadata") or {}).get("finalizers") or ())
    added = sorted(set((new.get("metadata") or {}).get("finalizers") or ()) - before)
    if not added:
        return []
    shown = "[]string{" + ", ".join(f'"{name}"' for name in added) + "}"
    detail = (
        "no new finalizers can be added if the object is being deleted, found new finalizers "
        + shown
    )
    return [Cause.forbidden("metadata.finalizers", detail)]


def _binding_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    before, after = old.get("roleRef") or {}, new.get("roleRef") or {}
    if before == after:
        return []
    shown = (
        f'rbac.RoleRef{{APIGroup:"{after.get("apiGroup", "")}", Kind:"{after.get("kind", "")}", '
        f'Name:"{after.get("name", "")}"}}'
    )
    return [Cause("FieldValueInvalid", f"Invalid value: {shown}: cannot change roleRef", "roleRef")]


_UPDATE: dict[Resource, UpdateValidator] = {
    PODS: _pod_update,
    JOBS: _job_update,
    DEPLOYMENTS: _deployment_update,
    SECRETS: _secret_update,
    ROLE_BINDINGS: _binding_update,
    CLUSTER_ROLE_BINDINGS: _binding_update,
}


def validate_update(resource: Resource, old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """`validate` plus the rules about what an update may change."""
    causes = _finalizer_causes(old, new)
    causes.extend(validate(resource, new))
    check = _UPDATE.get(resource)
    if check is not None:
        causes.extend(check(old, new))
    return causes
