"""Label and field selectors: the operators the API accepts, what they match, and the 400s a
malformed selector or an unsupported field label gets."""

from __future__ import annotations

import pytest

from sandbox import errors
from sandbox.resources import PODS
from sandbox.selectors import FieldSelector, LabelSelector

LABELS = {"app": "model", "tier": "gpu", "cards": "4"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("app=model", True),
        ("app==model", True),
        ("app!=model", False),
        ("app!=other", True),
        ("missing!=x", True),
        ("app in (model, other)", True),
        ("app notin (model)", False),
        ("tier", True),
        ("!tier", False),
        ("!missing", True),
        ("app=model,tier=cpu", False),
        ("cards>3", True),
        ("cards<3", False),
        ("app=model, tier in (gpu)", True),
    ],
)
def test_label_selector_matches(selector: str, expected: bool) -> None:
    assert LabelSelector.parse(selector).matches(LABELS) is expected


@pytest.mark.parametrize("selector", ["app in model", "a b", "=x", "app=(", "bad key!=x"])
def test_malformed_label_selector_is_bad_request(selector: str) -> None:
    with pytest.raises(errors.ApiError) as caught:
        LabelSelector.parse(selector)
    assert caught.value.code == 400


def test_label_selector_from_object() -> None:
    selector = LabelSelector.from_object(
        {
            "matchLabels": {"app": "model"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}],
        }
    )
    assert selector.matches(LABELS)
    assert not selector.matches({"app": "model"})


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", True),
        ("spec.nodeName==n1", True),
        ("spec.nodeName!=n1", False),
        ("status.phase!=Failed,status.phase!=Succeeded", True),
        ("metadata.name=a\\,b", True),
    ],
)
def test_field_selector_matches(selector: str, expected: bool) -> None:
    fields = {"spec.nodeName": "n1", "status.phase": "Running", "metadata.name": "a,b"}
    assert FieldSelector.parse(selector).matches(fields) is expected


def test_field_selector_equality_feeds_indexes() -> None:
    assert FieldSelector.parse("spec.nodeName=n1,status.phase!=x").equality("spec.nodeName") == "n1"
    assert FieldSelector.parse("spec.nodeName!=n1").equality("spec.nodeName") is None


def test_unsupported_field_label_is_bad_request() -> None:
    with pytest.raises(errors.ApiError) as caught:
        FieldSelector.parse("spec.foo=bar").check_supported(PODS.all_field_labels())
    assert caught.value.status()["message"] == "field label not supported: spec.foo"
    assert caught.value.code == 400
