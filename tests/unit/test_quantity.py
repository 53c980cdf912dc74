"""levers9.core.quantity against the kubernetes client's `parse_quantity`, which issue 35 asked
"where it agrees": over the API's own grammar they agree to the last digit the client's Decimal
keeps, so the client is the oracle here; outside it the client takes what the API server
refuses, which is why levers9 keeps its own 77 lines (the cases below: NaN, Infinity, an
exponent with a suffix, `1_000`, an exponent that would be computed digit by digit, and a
value past 28 digits rounded)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import quantity as client

from levers9.core.quantity import MAX_EXPONENT, millicores, parse_quantity, whole
from tests.properties import examples

client_quantity = cast(Callable[[str], Decimal], client.parse_quantity)  # untyped there
NUMBER = st.from_regex(r"\A[+-]?(?:[0-9]{1,12}(?:\.[0-9]{0,6})?|\.[0-9]{1,6})\Z")
SUFFIX = st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G"])


@examples(300)
@given(number=NUMBER, suffix=SUFFIX)
def test_the_apis_grammar_parses_as_the_kubernetes_client_parses_it(
    number: str, suffix: str
) -> None:
    ours = parse_quantity(number + suffix)
    with localcontext() as context:
        context.prec = 60  # the client's Decimal at the default 28 digits rounds 1e12 Ei
        theirs = client_quantity(number + suffix)
    assert Fraction(theirs) == ours


@pytest.mark.parametrize(
    ("text", "client_gives"),
    [
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("1.5e3Mi", "1.5728640E+9"),  # an exponent and a suffix: no API quantity has both
        ("1_000", "1000"),  # Python's digit grouping, not the API's
    ],
)
def test_what_the_client_takes_and_the_api_refuses_is_refused(text: str, client_gives: str) -> None:
    given = client_quantity(text)
    assert given.is_nan() if client_gives == "NaN" else given == Decimal(client_gives)
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


def test_an_exponent_no_node_has_is_refused_before_it_is_computed() -> None:
    assert client_quantity("1e999999999") == Decimal("1E+999999999")  # kept symbolic there
    with pytest.raises(ValueError, match=f"an exponent past e{MAX_EXPONENT}"):
        parse_quantity("1e999999999")


def test_exact_where_the_clients_decimal_rounds() -> None:
    text = "12345678901234567890123456789012Ki"
    assert parse_quantity(text) == 12345678901234567890123456789012 * 1024
    assert Fraction(client_quantity(text)) != parse_quantity(text)  # 28 digits kept there


@pytest.mark.parametrize(
    ("text", "cores", "units"), [("100m", 100, 1), ("1.5", 1500, 2), ("1Ki", 1024000, 1024)]
)
def test_rounding_as_the_api_rounds(text: str, cores: int, units: int) -> None:
    assert millicores(text) == cores
    assert whole(text) == units
