"""The GPU check's verdict on what the container saw: the spec's good run passes, a card that is
not the `--gpu` asked for or a matmul that disagrees fails with the reason, and a container that
saw no card (the sandbox) reports so without failing."""

from __future__ import annotations

import pytest

from levers9.task_records import check_mismatch, gpu_type_matches

SPEC_RUN: dict[str, object] = {
    "host": "runc",
    "nvidia_smi": "NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB",
    "cuda": True,
    "device": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "matmul_ok": True,
}


@pytest.mark.parametrize(
    ("gpu", "name", "matches"),
    [
        ("RTXPro6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
        ("H200", "NVIDIA H200", True),
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("L4", "NVIDIA L4", True),
        ("L4", "NVIDIA L40S", False),
        ("H100", "NVIDIA H200", False),
        ("T4", "Tesla T4", True),
        ("RTXPro6000", "NVIDIA RTX 6000 Ada Generation", False),
        ("", "NVIDIA L4", False),
    ],
)
def test_gpu_type_names_the_card(gpu: str, name: str, matches: bool) -> None:
    assert gpu_type_matches(gpu, name) is matches


def test_the_spec_run_passes() -> None:
    assert check_mismatch(SPEC_RUN, "RTXPro6000") is None


def test_another_card_fails_with_what_was_seen() -> None:
    assert check_mismatch(SPEC_RUN, "H200") == (
        "the container saw 'NVIDIA RTX PRO 6000 Blackwell Server Edition', not a H200:"
        " check --gpu and the pool's selector"
    )


def test_nvidia_smi_alone_is_enough_to_name_the_card() -> None:
    seen = {**SPEC_RUN, "cuda": False, "device": None, "matmul_ok": None}
    assert check_mismatch(seen, "RTXPro6000") is None
    assert check_mismatch(seen, "L4") is not None


def test_a_wrong_matmul_fails() -> None:
    assert check_mismatch({**SPEC_RUN, "matmul_ok": False}, "RTXPro6000") == (
        "the matmul on the GPU disagreed with the CPU's"
    )


def test_no_card_seen_is_reported_not_failed() -> None:
    sandbox = {"host": "process", "nvidia_smi": None, "cuda": False, "device": None}
    assert check_mismatch({**sandbox, "matmul_ok": None}, "RTXPro6000") is None
