"""Label and field selectors: parsed once per request, then matched per object in a few dict reads.

Grammar and error texts follow `k8s.io/apimachinery/pkg/labels` and `.../fields`: label
requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>n`, `k<n`
joined by commas; field requirements `f=v`, `f==v`, `f!=v`, with `\\` escaping `,` `=` `!` and
`\\` in values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox import errors

_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    """One label requirement; `values` is empty for exists / does-not-exist."""

    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        value = labels.get(self.key)
        if op in ("=", "in"):
            return value is not None and value in self.values
        if op in ("!=", "notin"):
            return value is None or value not in self.values
        if value is None:
            return False
        try:
            have, want = int(value), int(next(iter(self.values)))
        except ValueError:
            return False
        return have > want if op == "gt" else have < want


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of label requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    @staticmethod
    def parse(text: str | None) -> LabelSelector:
        """Parses a `labelSelector` query value; raises a 400 ApiError when malformed."""
        if not text or not text.strip():
            return LabelSelector()
        return LabelSelector(tuple(_LabelParser(text).parse()))

    @staticmethod
    def from_object(selector: Mapping[str, Any] | None) -> LabelSelector:
        """The selector a `metav1.LabelSelector` (matchLabels / matchExpressions) describes."""
        if not selector:
            return LabelSelector()
        reqs = [
            Requirement(k, "=", frozenset([str(v)]))
            for k, v in sorted((selector.get("matchLabels") or {}).items())
        ]
        ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
        for expr in selector.get("matchExpressions") or []:
            op = ops.get(str(expr.get("operator")))
            if op is None:
                raise errors.bad_request(
                    f'"{expr.get("operator")}" is not a valid label selector operator'
                )
            values = frozenset(str(v) for v in expr.get("values") or [])
            reqs.append(Requirement(str(expr.get("key")), op, values))
        return LabelSelector(tuple(reqs))


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not _QUALIFIED.match(name):
        raise errors.bad_request(
            f"unable to parse requirement: <nil>: Invalid value: {key!r}: name part must consist "
            "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )
    if "/" in key and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        raise errors.bad_request(
            f"unable to parse requirement: <nil>: Invalid value: {key!r}: prefix part must be a "
            "lowercase RFC 1123 subdomain"
        )


def _check_value(key: str, value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise errors.bad_request(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{value}": a valid '
            "label must be an empty string or consist of alphanumeric characters, '-', '_' or "
            "'.', and must start and end with an alphanumeric character"
        )


class _LabelParser:
    """A small recursive-descent parser over the label selector grammar."""

    _TOKEN = re.compile(r"\s*(==|!=|=|\(|\)|,|!|>|<|[^\s=!(),<>]+)")

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = self._TOKEN.match(text, pos)
            if m is None:
                raise errors.bad_request(f"unable to parse requirement: found '{text[pos]}'")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.pos = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> str:
        tok = self._peek()
        if tok is None:
            raise errors.bad_request(f"found '', expected: identifier after '{self.text}'")
        self.pos += 1
        return tok

    def parse(self) -> Iterable[Requirement]:
        out = [self._requirement()]
        while self._peek() is not None:
            if self._next() != ",":
                raise errors.bad_request(f"found '{self.tokens[self.pos - 1]}', expected: ','")
            out.append(self._requirement())
        return out

    def _requirement(self) -> Requirement:
        tok = self._next()
        if tok == "!":
            key = self._next()
            _check_key(key)
            return Requirement(key, "!")
        key = tok
        _check_key(key)
        op = self._peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.pos += 1
        if op in ("=", "=="):
            return Requirement(key, "=", frozenset([self._value(key)]))
        if op == "!=":
            return Requirement(key, "!=", frozenset([self._value(key)]))
        if op in (">", "<"):
            number = self._next()
            if not number.lstrip("-").isdigit():
                raise errors.bad_request(
                    f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be "
                    f"an integer: {number}"
                )
            return Requirement(key, "gt" if op == ">" else "lt", frozenset([number]))
        if op in ("in", "notin"):
            values = self._set()
            for value in values:
                _check_value(key, value)
            return Requirement(key, op, frozenset(values))
        raise errors.bad_request(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")

    def _value(self, key: str) -> str:
        tok = self._peek()
        if tok is None or tok == ",":
            return ""
        self.pos += 1
        _check_value(key, tok)
        return tok

    def _set(self) -> list[str]:
        if self._next() != "(":
            raise errors.bad_request("found '', expected: '('")
        values: list[str] = []
        while True:
            tok = self._next()
            if tok == ")":
                break
            if tok == ",":
                continue
            values.append(tok)
        return values


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    equal: bool


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of field equalities/inequalities over a resource's field labels."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        for req in self.requirements:
            if (fields.get(req.field, "") == req.value) != req.equal:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.requirements

    def equality(self, field: str) -> str | None:
        """The value this selector pins `field` to, if it has an `=` requirement on it."""
        for req in self.requirements:
            if req.equal and req.field == field:
                return req.value
        return None

    def check_supported(self, supported: Iterable[str]) -> None:
        allowed = set(supported)
        for req in self.requirements:
            if req.field not in allowed:
                raise errors.bad_request(f"field label not supported: {req.field}")

    @staticmethod
    def parse(text: str | None) -> FieldSelector:
        if not text or not text.strip():
            return FieldSelector()
        return FieldSelector(tuple(_parse_field_term(t) for t in _split_unescaped(text, ",")))


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, escaped = [], [], False
    for ch in text:
        if escaped:
            cur.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if escaped:
        cur.append("\\")
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value) and value[i + 1] in "\\,=!":
            out.append(value[i + 1])
            i += 2
            continue
        if value[i] == "\\":
            raise errors.bad_request(
                f"invalid field selector: invalid escape sequence in {value!r}"
            )
        out.append(value[i])
        i += 1
    return "".join(out)


def _parse_field_term(term: str) -> FieldRequirement:
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        index = _find_unescaped(term, op)
        if index >= 0:
            field = term[:index].strip()
            value = _unescape(term[index + len(op) :].strip())
            if not field:
                break
            return FieldRequirement(field, value, equal)
    raise errors.bad_request(f"invalid selector: '{term}'; can't understand '{term}'")


def _find_unescaped(text: str, op: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(op, i):
            if op == "=" and i > 0 and text[i - 1] == "!":
                i += 1
                continue
            return i
        i += 1
    return -1
