"""PATCH formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the strategic merge
patch kubectl and the official client send (lists merged by key, directives)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import errors
from sandbox.patch import PatchType, apply_patch

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "containers": [
            {"name": "main", "image": "one", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "two"},
        ],
        "tolerations": [{"key": "t1"}],
    },
}


def test_merge_patch_sets_and_deletes_keys_and_replaces_lists() -> None:
    out = apply_patch(
        PatchType.MERGE,
        POD,
        {
            "metadata": {"labels": {"a": None, "c": "3"}},
            "spec": {"containers": [{"name": "only", "image": "x"}]},
        },
    )
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["only"]
    assert POD["metadata"]["labels"] == {"a": "1", "b": "2"}, "the original is untouched"


def test_strategic_merge_merges_containers_by_name() -> None:
    out = apply_patch(
        PatchType.STRATEGIC,
        POD,
        {
            "spec": {
                "containers": [{"name": "side", "image": "three"}, {"name": "new", "image": "n"}]
            }
        },
    )
    images = {c["name"]: c["image"] for c in out["spec"]["containers"]}
    assert images == {"main": "one", "side": "three", "new": "n"}
    assert out["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_strategic_merge_directives() -> None:
    out = apply_patch(
        PatchType.STRATEGIC,
        POD,
        {
            "metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["x"]},
            "spec": {
                "containers": [{"name": "side", "$patch": "delete"}],
                "$setElementOrder/containers": [{"name": "main"}],
                "tolerations": [{"key": "t2"}],
            },
        },
    )
    assert out["metadata"]["finalizers"] == ["y"]
    assert [c["name"] for c in out["spec"]["containers"]] == ["main"]
    assert out["spec"]["tolerations"] == [{"key": "t2"}], "lists without a strategy replace"


def test_strategic_merge_replace_directive() -> None:
    out = apply_patch(
        PatchType.STRATEGIC, POD, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}}
    )
    assert out["metadata"]["labels"] == {"z": "9"}


def test_strategic_merge_of_cordon_and_uncordon() -> None:
    node: dict[str, Any] = {"metadata": {"name": "n"}, "spec": {}}
    cordoned = apply_patch(PatchType.STRATEGIC, node, {"spec": {"unschedulable": True}})
    assert cordoned["spec"]["unschedulable"] is True
    uncordoned = apply_patch(PatchType.STRATEGIC, cordoned, {"spec": {"unschedulable": None}})
    assert "unschedulable" not in uncordoned["spec"]


def test_json_patch_operations() -> None:
    out = apply_patch(
        PatchType.JSON,
        POD,
        [
            {"op": "add", "path": "/metadata/labels/c", "value": "3"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "four"},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "t3"}},
            {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"},
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
        ],
    )
    assert out["metadata"]["labels"] == {"b": "2", "c": "3", "name": "p"}
    assert out["spec"]["containers"][0]["image"] == "four"
    assert out["spec"]["tolerations"][-1] == {"key": "t3"}


@pytest.mark.parametrize(
    ("patch_type", "patch", "code"),
    [
        (PatchType.JSON, {"not": "a list"}, 400),
        (PatchType.JSON, [{"op": "test", "path": "/metadata/name", "value": "q"}], 422),
        (PatchType.JSON, [{"op": "replace", "path": "/nope/x", "value": 1}], 422),
        (PatchType.MERGE, ["a list"], 400),
    ],
)
def test_patches_that_cannot_apply(patch_type: PatchType, patch: Any, code: int) -> None:
    with pytest.raises(errors.ApiError) as caught:
        apply_patch(patch_type, POD, patch)
    assert caught.value.code == code
