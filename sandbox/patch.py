"""The three PATCH formats the API accepts: JSON merge, JSON patch and strategic merge.

Strategic merge follows `k8s.io/apimachinery/pkg/util/strategicpatch` for what kubectl and the
official client send: lists of containers, env, volumes, conditions, ownerReferences ... merge
by their key instead of being replaced, `finalizers` merge as a set, and the directives
`$patch: replace|delete`, `$deleteFromPrimitiveList/<field>`, `$retainKeys` and
`$setElementOrder/<field>` (ordering only; ignored) are honoured. The real implementation reads
each field's patch strategy from the Go types; this one keys it on the field's name, which is
equivalent for the types the emulator serves.
"""

from __future__ import annotations

import copy
import enum
from typing import Any

from sandbox import errors


class PatchType(enum.StrEnum):
    JSON = "application/json-patch+json"
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    APPLY = "application/apply-patch+yaml"


SUPPORTED_PATCH_TYPES = (PatchType.JSON, PatchType.MERGE, PatchType.STRATEGIC)

# The patchMergeKey of list fields with patchStrategy "merge" in the served types.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "taints": "key",
    "imagePullSecrets": "name",
    "addresses": "type",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars with patchStrategy "merge": a patch adds to them rather than replacing.
PRIMITIVE_MERGE = frozenset({"finalizers"})

_DELETE_FROM = "$deleteFromPrimitiveList/"
_ELEMENT_ORDER = "$setElementOrder/"


def apply_patch(patch_type: PatchType, original: dict[str, Any], patch: Any) -> dict[str, Any]:
    """The object after `patch`; raises ApiError 400/422 the way the apiserver does."""
    if patch_type is PatchType.JSON:
        if not isinstance(patch, list):
            raise errors.bad_request(
                "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        return apply_json_patch(original, patch)
    if not isinstance(patch, dict):
        raise errors.bad_request(
            "json: cannot unmarshal array into Go value of type map[string]interface {}"
        )
    if patch_type is PatchType.MERGE:
        merged = merge_patch(original, patch)
    else:
        merged = strategic_merge_patch(original, patch)
    if not isinstance(merged, dict):
        raise errors.bad_request("the patch did not produce an object")
    return merged


def merge_patch(original: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(original: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive is not None:
        raise errors.bad_request(f"Unknown patch type: {directive}")
    result = dict(original) if isinstance(original, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith(_ELEMENT_ORDER) or key == "$retainKeys":
            continue
        if key.startswith(_DELETE_FROM):
            field = key[len(_DELETE_FROM) :]
            doomed = set(map(_hashable, value or []))
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [v for v in current if _hashable(v) not in doomed]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    if isinstance(retain, list):
        keep = set(retain)
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    current = list(original) if isinstance(original, list) else []
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    merge_key = MERGE_KEYS.get(field)
    if field in PRIMITIVE_MERGE:
        seen = set(map(_hashable, current))
        return current + [v for v in patch if _hashable(v) not in seen]
    if merge_key is None or not all(isinstance(v, dict) for v in current + patch):
        return [copy.deepcopy(v) for v in patch]
    for element in patch:
        if merge_key not in element:
            raise errors.bad_request(
                f"map: {element} does not contain declared merge key: {merge_key}"
            )
        index = next(
            (i for i, v in enumerate(current) if v.get(merge_key) == element[merge_key]), None
        )
        if element.get("$patch") == "delete":
            if index is not None:
                del current[index]
            continue
        if index is None:
            current.append(strategic_merge_patch({}, element))
        else:
            current[index] = strategic_merge_patch(current[index], element)
    return current


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, dict | list) else value


# -- RFC 6902 --------------------------------------------------------------------------------


def apply_json_patch(original: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    doc: Any = copy.deepcopy(original)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op:
            raise errors.bad_request("Unexpected kind: missing op")
        doc = _apply_operation(doc, op)
    if not isinstance(doc, dict):
        raise errors.unprocessable("the patch did not produce an object")
    return doc


def _apply_operation(doc: Any, op: dict[str, Any]) -> Any:
    kind = op["op"]
    path = str(op.get("path", ""))
    if kind == "add":
        return _add(doc, path, copy.deepcopy(op.get("value")), kind)
    if kind == "remove":
        _remove(doc, path, kind)
        return doc
    if kind == "replace":
        parent, token = _parent(doc, path, kind)
        if _get_child(parent, token, kind, path) is _MISSING:
            raise errors.unprocessable(
                f"replace operation does not apply: doc is missing key: {path}: missing value"
            )
        _set_child(parent, token, copy.deepcopy(op.get("value")), kind, path)
        return doc
    if kind in ("move", "copy"):
        source = str(op.get("from", ""))
        parent, token = _parent(doc, source, kind)
        value = _get_child(parent, token, kind, source)
        if value is _MISSING:
            raise errors.unprocessable(
                f"{kind} operation does not apply: doc is missing from path: {source}: "
                "missing value"
            )
        if kind == "move":
            _remove(doc, source, kind)
        return _add(doc, path, copy.deepcopy(value), kind)
    if kind == "test":
        parent, token = _parent(doc, path, kind)
        if _get_child(parent, token, kind, path) != op.get("value"):
            raise errors.unprocessable(f"testing value {path} failed: test failed")
        return doc
    raise errors.bad_request(f"Unexpected kind: {kind}")


class _Missing:
    pass


_MISSING = _Missing()


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.bad_request(f'JSON pointer must be empty or start with a "/": {path}')
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, path: str, kind: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise errors.unprocessable(f'{kind} operation does not apply: doc is missing path: ""')
    cur = doc
    for token in tokens[:-1]:
        cur = _get_child(cur, token, kind, path)
        if cur is _MISSING or not isinstance(cur, dict | list):
            raise errors.unprocessable(
                f'{kind} operation does not apply: doc is missing path: "{path}": missing value'
            )
    return cur, tokens[-1]


def _get_child(parent: Any, token: str, kind: str, path: str) -> Any:
    if isinstance(parent, dict):
        return parent.get(token, _MISSING)
    if isinstance(parent, list):
        index = _index(token, len(parent), kind, path)
        return parent[index] if index < len(parent) else _MISSING
    return _MISSING


def _set_child(parent: Any, token: str, value: Any, kind: str, path: str) -> None:
    if isinstance(parent, dict):
        parent[token] = value
    else:
        parent[_index(token, len(parent) - 1, kind, path)] = value


def _index(token: str, limit: int, kind: str, path: str) -> int:
    if not token.isdigit() or int(token) > limit:
        raise errors.unprocessable(f"{kind} operation does not apply: index out of bounds: {path}")
    return int(token)


def _add(doc: Any, path: str, value: Any, kind: str) -> Any:
    if path == "":
        return value
    parent, token = _parent(doc, path, kind)
    if isinstance(parent, list):
        index = len(parent) if token == "-" else _index(token, len(parent), kind, path)
        parent.insert(index, value)
    else:
        parent[token] = value
    return doc


def _remove(doc: Any, path: str, kind: str) -> None:
    parent, token = _parent(doc, path, kind)
    if _get_child(parent, token, kind, path) is _MISSING:
        raise errors.unprocessable(
            f"{kind} operation does not apply: doc is missing key: {path}: missing value"
        )
    if isinstance(parent, list):
        del parent[int(token)]
    else:
        del parent[token]
