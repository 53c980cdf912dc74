"""Kubernetes resource quantities (`500m`, `2`, `1Gi`, `1e3`), parsed exactly.

The API's `resource.Quantity` grammar: a signed decimal number, then an optional binary suffix
(Ki, Mi, Gi, Ti, Pi, Ei), decimal suffix (n, u, m, k, M, G, T, P, E) or decimal exponent
(`e3`, `E-2`). Values are exact (`Fraction`); callers round as the API does: CPU to millicores,
everything else up to whole units.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
MAX_EXPONENT = 30
"""The largest decimal exponent taken (`1e30`); Kubernetes' own largest suffix is E (1e18)."""
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exponent>[eE][+-]?\d+)|(?P<decimal>[numkMGTPE]?))$"
)


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity; raises ValueError naming the text when it is not one."""
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
        return Fraction(text)
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
    number = Fraction(match["number"])
    if match["binary"]:
        return number * _BINARY[match["binary"]]
    if match["exponent"]:
        exponent = int(match["exponent"][1:])
        if abs(exponent) > MAX_EXPONENT:
            # 10**1e9 is computed digit by digit: refused before, never waited for.
            raise ValueError(
                f"{text!r}: an exponent past e{MAX_EXPONENT} is no resource any node has"
                " (e.g. 500m, 2, 1Gi)"
            )
        return number * Fraction(10) ** exponent
    return number * _DECIMAL[match["decimal"] or ""]


def millicores(text: str | int | float) -> int:
    """CPU in millicores, rounded up as the API rounds sub-milli CPU."""
    return math.ceil(parse_quantity(text) * 1000)


def whole(text: str | int | float) -> int:
    """Memory bytes or device counts, rounded up to a whole unit."""
    return math.ceil(parse_quantity(text))


def binary_text(value: int) -> str:
    """Bytes as a person reads them: `8Gi`, `1Ti`, `172.3Gi`, `512`."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        size = _BINARY[suffix]
        if value >= size:
            exact = value % size == 0
            return f"{value // size}{suffix}" if exact else f"{value / size:.1f}{suffix}"
    return str(value)
