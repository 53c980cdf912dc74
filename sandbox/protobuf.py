"""Decoding the Kubernetes protobuf request bodies kubectl sends for `kubectl create <generator>`.

kubectl's typed clients write `Content-Type: application/vnd.kubernetes.protobuf` bodies
(`kubectl create namespace|secret|configmap|job|deployment|serviceaccount|token|role|
clusterrole|rolebinding|clusterrolebinding`, `kubectl auth whoami|can-i`) and do not fall back
to JSON, so
the emulator reads that encoding: the `k8s\\x00` magic, a `runtime.Unknown` envelope naming
apiVersion and kind, and the object in the field numbers of the types' `generated.proto`.

Only the fields those generators (and hand-built objects of the same kinds) use are described
below; a body that sets any other field is refused with 415 rather than silently losing it
(an undescribed field holding its zero value is the same as absent, and is accepted).
Responses are always JSON (clients accept it: they ask for protobuf *or* JSON).
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

from sandbox import errors

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


@dataclass(frozen=True)
class F:
    """One field: JSON name, kind, message type (for kind "msg"), repeated, pointer.

    Kinds: str, bytes, int, bool, msg, map (string->string), mapb (string->bytes, base64 in
    JSON), mapq (string->Quantity), qty (Quantity), intstr, time, skip (read and dropped:
    status blocks, which a create discards anyway). Non-pointer scalars are always on the
    wire, so their zero values are dropped, as JSON's omitempty would; pointers keep them.
    """

    name: str
    kind: str
    msg: str = ""
    repeated: bool = False
    pointer: bool = False


def _r(name: str, kind: str, msg: str = "") -> F:
    return F(name, kind, msg, repeated=True)


def _p(name: str, kind: str) -> F:
    return F(name, kind, pointer=True)


_OBJECT_META = {
    1: F("name", "str"),
    2: F("generateName", "str"),
    3: F("namespace", "str"),
    4: F("selfLink", "str"),
    5: F("uid", "str"),
    6: F("resourceVersion", "str"),
    7: F("generation", "int"),
    8: F("creationTimestamp", "time"),
    9: F("deletionTimestamp", "time"),
    10: _p("deletionGracePeriodSeconds", "int"),
    11: F("labels", "map"),
    12: F("annotations", "map"),
    13: _r("ownerReferences", "msg", "OwnerReference"),
    14: _r("finalizers", "str"),
}
_SCHEMAS: dict[str, dict[int, F]] = {
    "ObjectMeta": _OBJECT_META,
    "OwnerReference": {
        5: F("apiVersion", "str"),
        1: F("kind", "str"),
        3: F("name", "str"),
        4: F("uid", "str"),
        6: _p("controller", "bool"),
        7: _p("blockOwnerDeletion", "bool"),
    },
    "LabelSelector": {
        1: F("matchLabels", "map"),
        2: _r("matchExpressions", "msg", "LabelSelectorRequirement"),
    },
    "LabelSelectorRequirement": {
        1: F("key", "str"),
        2: F("operator", "str"),
        3: _r("values", "str"),
    },
    "Namespace": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "NamespaceSpec"),
        3: F("status", "skip"),
    },
    "NamespaceSpec": {1: _r("finalizers", "str")},
    "Secret": {
        1: F("metadata", "msg", "ObjectMeta"),
        5: _p("immutable", "bool"),
        2: F("data", "mapb"),
        4: F("stringData", "map"),
        3: F("type", "str"),
    },
    "ConfigMap": {
        1: F("metadata", "msg", "ObjectMeta"),
        4: _p("immutable", "bool"),
        2: F("data", "map"),
        3: F("binaryData", "mapb"),
    },
    "Pod": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "PodSpec"),
        3: F("status", "skip"),
    },
    "PodTemplateSpec": {1: F("metadata", "msg", "ObjectMeta"), 2: F("spec", "msg", "PodSpec")},
    "PodSpec": {
        20: _r("initContainers", "msg", "Container"),
        2: _r("containers", "msg", "Container"),
        3: F("restartPolicy", "str"),
        4: _p("terminationGracePeriodSeconds", "int"),
        5: _p("activeDeadlineSeconds", "int"),
        6: F("dnsPolicy", "str"),
        7: F("nodeSelector", "map"),
        8: F("serviceAccountName", "str"),
        9: F("serviceAccount", "str"),
        21: _p("automountServiceAccountToken", "bool"),
        10: F("nodeName", "str"),
        11: F("hostNetwork", "bool"),
        12: F("hostPID", "bool"),
        13: F("hostIPC", "bool"),
        16: F("hostname", "str"),
        17: F("subdomain", "str"),
        19: F("schedulerName", "str"),
        22: _r("tolerations", "msg", "Toleration"),
        24: F("priorityClassName", "str"),
        25: _p("priority", "int"),
        30: _p("enableServiceLinks", "bool"),
    },
    "Container": {
        1: F("name", "str"),
        2: F("image", "str"),
        3: _r("command", "str"),
        4: _r("args", "str"),
        5: F("workingDir", "str"),
        6: _r("ports", "msg", "ContainerPort"),
        7: _r("env", "msg", "EnvVar"),
        8: F("resources", "msg", "ResourceRequirements"),
        9: _r("volumeMounts", "msg", "VolumeMount"),
        13: F("terminationMessagePath", "str"),
        20: F("terminationMessagePolicy", "str"),
        14: F("imagePullPolicy", "str"),
        15: F("securityContext", "msg", "SecurityContext"),
        16: F("stdin", "bool"),
        17: F("stdinOnce", "bool"),
        18: F("tty", "bool"),
    },
    "ContainerPort": {
        1: F("name", "str"),
        2: F("hostPort", "int"),
        3: F("containerPort", "int"),
        4: F("protocol", "str"),
        5: F("hostIP", "str"),
    },
    "EnvVar": {1: F("name", "str"), 2: F("value", "str")},
    "ResourceRequirements": {1: F("limits", "mapq"), 2: F("requests", "mapq")},
    "VolumeMount": {
        1: F("name", "str"),
        2: F("readOnly", "bool"),
        3: F("mountPath", "str"),
        4: F("subPath", "str"),
    },
    "SecurityContext": {
        2: _p("privileged", "bool"),
        4: _p("runAsUser", "int"),
        8: _p("runAsGroup", "int"),
        5: _p("runAsNonRoot", "bool"),
    },
    "Toleration": {
        1: F("key", "str"),
        2: F("operator", "str"),
        3: F("value", "str"),
        4: F("effect", "str"),
        5: _p("tolerationSeconds", "int"),
    },
    "Job": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "JobSpec"),
        3: F("status", "skip"),
    },
    "JobSpec": {
        1: _p("parallelism", "int"),
        2: _p("completions", "int"),
        3: _p("activeDeadlineSeconds", "int"),
        7: _p("backoffLimit", "int"),
        4: F("selector", "msg", "LabelSelector"),
        5: _p("manualSelector", "bool"),
        6: F("template", "msg", "PodTemplateSpec"),
        8: _p("ttlSecondsAfterFinished", "int"),
        9: F("completionMode", "str"),
        10: _p("suspend", "bool"),
        14: F("podReplacementPolicy", "str"),
    },
    "Deployment": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "DeploymentSpec"),
        3: F("status", "skip"),
    },
    "DeploymentSpec": {
        1: _p("replicas", "int"),
        2: F("selector", "msg", "LabelSelector"),
        3: F("template", "msg", "PodTemplateSpec"),
        4: F("strategy", "msg", "DeploymentStrategy"),
        5: F("minReadySeconds", "int"),
        6: _p("revisionHistoryLimit", "int"),
        7: F("paused", "bool"),
        9: _p("progressDeadlineSeconds", "int"),
    },
    "DeploymentStrategy": {
        1: F("type", "str"),
        2: F("rollingUpdate", "msg", "RollingUpdateDeployment"),
    },
    "RollingUpdateDeployment": {1: F("maxUnavailable", "intstr"), 2: F("maxSurge", "intstr")},
    "ServiceAccount": {
        1: F("metadata", "msg", "ObjectMeta"),
        4: _p("automountServiceAccountToken", "bool"),
    },
    "TokenRequest": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "TokenRequestSpec"),
        3: F("status", "skip"),
    },
    "TokenRequestSpec": {
        1: _r("audiences", "str"),
        4: _p("expirationSeconds", "int"),
        3: F("boundObjectRef", "msg", "BoundObjectReference"),
    },
    "BoundObjectReference": {
        1: F("kind", "str"),
        2: F("apiVersion", "str"),
        3: F("name", "str"),
        4: F("uid", "str"),
    },
    "Role": {1: F("metadata", "msg", "ObjectMeta"), 2: _r("rules", "msg", "PolicyRule")},
    "ClusterRole": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: _r("rules", "msg", "PolicyRule"),
        3: F("aggregationRule", "msg", "AggregationRule"),
    },
    "AggregationRule": {1: _r("clusterRoleSelectors", "msg", "LabelSelector")},
    "PolicyRule": {
        1: _r("verbs", "str"),
        2: _r("apiGroups", "str"),
        3: _r("resources", "str"),
        4: _r("resourceNames", "str"),
        5: _r("nonResourceURLs", "str"),
    },
    "RoleBinding": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: _r("subjects", "msg", "Subject"),
        3: F("roleRef", "msg", "RoleRef"),
    },
    "Subject": {
        1: F("kind", "str"),
        2: F("apiGroup", "str"),
        3: F("name", "str"),
        4: F("namespace", "str"),
    },
    "RoleRef": {1: F("apiGroup", "str"), 2: F("kind", "str"), 3: F("name", "str")},
    "SelfSubjectReview": {1: F("metadata", "msg", "ObjectMeta"), 2: F("status", "skip")},
    "SelfSubjectAccessReview": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "SelfSubjectAccessReviewSpec"),
        3: F("status", "skip"),
    },
    "SelfSubjectAccessReviewSpec": {
        1: F("resourceAttributes", "msg", "ResourceAttributes"),
        2: F("nonResourceAttributes", "msg", "NonResourceAttributes"),
    },
    "ResourceAttributes": {
        1: F("namespace", "str"),
        2: F("verb", "str"),
        3: F("group", "str"),
        4: F("version", "str"),
        5: F("resource", "str"),
        6: F("subresource", "str"),
        7: F("name", "str"),
    },
    "NonResourceAttributes": {1: F("path", "str"), 2: F("verb", "str")},
    "SelfSubjectRulesReview": {
        1: F("metadata", "msg", "ObjectMeta"),
        2: F("spec", "msg", "SelfSubjectRulesReviewSpec"),
        3: F("status", "skip"),
    },
    "SelfSubjectRulesReviewSpec": {1: F("namespace", "str")},
}
_ROOTS = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "Secret"): "Secret",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Pod"): "Pod",
    ("batch/v1", "Job"): "Job",
    ("apps/v1", "Deployment"): "Deployment",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
    ("rbac.authorization.k8s.io/v1", "Role"): "Role",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "ClusterRole",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "RoleBinding",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def varint(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.data):
                raise ValueError("truncated varint")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def fields(self) -> list[tuple[int, int, Any]]:
        out = []
        while self.pos < len(self.data):
            key = self.varint()
            number, wire = key >> 3, key & 7
            value: Any
            if wire == 0:
                value = self.varint()
            elif wire == 2:
                size = self.varint()
                value = self.data[self.pos : self.pos + size]
                self.pos += size
            elif wire == 1:
                value, self.pos = self.data[self.pos : self.pos + 8], self.pos + 8
            elif wire == 5:
                value, self.pos = self.data[self.pos : self.pos + 4], self.pos + 4
            else:
                raise ValueError(f"unsupported wire type {wire}")
            out.append((number, wire, value))
        return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _map_entry(raw: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _, item in _Reader(raw).fields():
        if number == 1:
            key = bytes(item).decode()
        elif number == 2:
            value = bytes(item)
    return key, value


def _scalar(field: F, raw: Any, where: str) -> Any:
    kind = field.kind
    if kind == "str":
        return bytes(raw).decode()
    if kind == "bytes":
        return base64.b64encode(bytes(raw)).decode()
    if kind == "int":
        return _signed(int(raw))
    if kind == "bool":
        return bool(raw)
    if kind == "qty":
        return _decode("Quantity", bytes(raw), where).get("string", "")
    if kind == "time":
        parts = {n: v for n, _, v in _Reader(bytes(raw)).fields()}
        seconds = _signed(int(parts.get(1, 0)))
        return (
            None
            if seconds == 0
            else dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
    if kind == "intstr":
        parts = {n: v for n, _, v in _Reader(bytes(raw)).fields()}
        if int(parts.get(1, 0)) == 1:
            return bytes(parts.get(3, b"")).decode()
        return _signed(int(parts.get(2, 0)))
    if kind == "msg":
        return _decode(field.msg, bytes(raw), where)
    raise ValueError(f"unknown field kind {kind}")


def _decode(message: str, data: bytes, where: str) -> dict[str, Any]:
    if message == "Quantity":
        return {
            "string": next((bytes(v).decode() for n, _, v in _Reader(data).fields() if n == 1), "")
        }
    schema = _SCHEMAS[message]
    out: dict[str, Any] = {}
    for number, _, raw in _Reader(data).fields():
        field = schema.get(number)
        if field is None and raw in (0, b""):
            continue  # a zero value: the same as absent (non-pointer fields are always sent)
        if field is None:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                f"the emulator does not decode field {number} of {message} ({where}) from "
                "protobuf; send the object as JSON (e.g. kubectl apply -f)",
            )
        if field.kind == "skip":
            continue
        path = f"{where}.{field.name}"
        if field.kind in ("map", "mapb", "mapq"):
            key, value = _map_entry(bytes(raw))
            entries = out.setdefault(field.name, {})
            if field.kind == "map":
                entries[key] = value.decode()
            elif field.kind == "mapb":
                entries[key] = base64.b64encode(value).decode()
            else:
                entries[key] = _decode("Quantity", value, path)["string"]
            continue
        value = _scalar(field, raw, path)
        if field.repeated:
            out.setdefault(field.name, []).append(value)
        elif value is not None and (
            field.pointer or field.kind == "msg" or value not in ("", 0, False)
        ):
            out[field.name] = value
    return out


def decode_object(data: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object; 415 for kinds or fields not described."""
    if not data.startswith(_MAGIC):
        raise errors.bad_request("protobuf body lacks the k8s\\x00 prefix")
    try:
        envelope = {n: v for n, _, v in _Reader(data[len(_MAGIC) :]).fields()}
        type_meta = {
            n: bytes(v).decode() for n, _, v in _Reader(bytes(envelope.get(1, b""))).fields()
        }
        api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
        root = _ROOTS.get((api_version, kind))
        if root is None:
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                f"the emulator does not decode {kind} ({api_version}) from protobuf; send JSON",
            )
        obj = _decode(root, bytes(envelope.get(2, b"")), kind)
    except (ValueError, UnicodeDecodeError) as error:
        raise errors.bad_request(f"unable to decode protobuf body: {error}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}
