"""The GPU check's verdict on what the container saw: the spec's good run passes, a card that is
not the `--gpu` asked for or a matmul that disagrees fails with the reason, and a container that
saw no card fails (a broken driver or device plugin) unless the pool says `simulatedGpus: true`
(the sandbox), where `levers9 pool check` says it saw none, as expected, and COMPLETE."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from levers9.cli.output import console
from levers9.cli.pool import print_check
from levers9.models import TaskRecord
from levers9.records.tasks import check_mismatch, check_report, gpu_type_matches, saw_no_card

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


NO_CARD: dict[str, object] = {
    "host": "runc",
    "nvidia_smi": None,
    "cuda": False,
    "device": None,
    "matmul_ok": None,
}


def test_no_card_seen_fails_naming_the_driver_and_the_device_plugin() -> None:
    assert check_mismatch(NO_CARD, "RTXPro6000") == (
        "the container saw no GPU: check the node's driver and the device plugin"
    )


def test_no_card_seen_passes_on_a_simulated_pool() -> None:
    assert check_mismatch(NO_CARD, "RTXPro6000", simulated=True) is None


def test_a_card_seen_on_a_simulated_pool_is_still_checked() -> None:
    assert check_mismatch(SPEC_RUN, "RTXPro6000", simulated=True) is None
    assert check_mismatch(SPEC_RUN, "H200", simulated=True) is not None


def _record(seen: dict[str, object], state: str = "succeeded") -> TaskRecord:
    result = {k: v for k, v in seen.items() if k != "host"}
    return TaskRecord(
        task_id="t-1",
        pool_name="gke-rtx6000",
        command=("levers9-probe",),
        gpus=1,
        image="python:3.12-slim",
        state=state,
        created_at=datetime(2026, 12, 4, tzinfo=UTC),
        result_json=json.dumps(result),
        host=str(seen["host"]),
        reason="" if state == "succeeded" else "exit code 1",
    )


def _printed(record: TaskRecord, *, simulated: bool) -> tuple[bool, str]:
    with console.capture() as captured:
        passed = print_check(record, "RTXPro6000", simulated=simulated)
    return passed, captured.get()


def test_the_check_on_a_simulated_pool_says_no_card_was_expected() -> None:
    passed, text = _printed(_record(NO_CARD), simulated=True)
    assert passed
    assert text.startswith("simulated cards: no GPU was visible, as expected\nCOMPLETE {")
    assert json.loads(text[text.index("{") :]) == NO_CARD


def test_the_check_on_a_real_pool_that_saw_no_card_fails_with_the_reason() -> None:
    passed, text = _printed(_record(NO_CARD), simulated=False)
    assert not passed
    assert text.startswith("FAILED {")
    assert json.loads(text[text.index("{") :]) == {
        **NO_CARD,
        "reason": "the container saw no GPU: check the node's driver and the device plugin",
    }


def test_the_check_of_a_real_card_prints_no_simulated_line() -> None:
    passed, text = _printed(_record(SPEC_RUN), simulated=True)
    assert passed
    assert text.startswith("COMPLETE {")
    assert json.loads(text[text.index("{") :]) == SPEC_RUN


def test_a_task_that_failed_fails_the_check_even_on_a_simulated_pool() -> None:
    passed, text = _printed(_record(NO_CARD, state="failed"), simulated=True)
    assert not passed
    assert "simulated cards" not in text
    assert json.loads(text[text.index("{") :])["reason"] == "exit code 1"


# The edges below were found by the mutation check (benchmarks/mutation.py).


def test_the_report_keeps_the_spec_keys_and_says_which_runtime() -> None:
    assert check_report(_record(SPEC_RUN)) == SPEC_RUN
    empty = _record(NO_CARD).model_copy(update={"result_json": "", "host": ""})
    assert check_report(empty) == {key: None for key in SPEC_RUN}


@pytest.mark.parametrize("printed", ["42", '["NVIDIA H200"]', "not json"])
def test_a_result_that_is_not_a_json_object_fails_with_what_was_printed(printed: str) -> None:
    """Before the mutation check a non-object result was a TypeError (a traceback), and text
    that was not JSON was dropped from the report and passed on a simulated pool."""
    record = _record(SPEC_RUN).model_copy(update={"result_json": printed})
    report = check_report(record)
    assert report == {**{key: None for key in SPEC_RUN}, "host": "runc", "unparsed": printed}
    for simulated in (False, True):
        assert check_mismatch(report, "H200", simulated=simulated) == (
            "the probe's result is not a JSON object (under `unparsed`):"
            " check that the pool's image runs levers9's levers9-probe"
        )


@pytest.mark.parametrize("key", ["device", "nvidia_smi", "cuda"])
def test_any_one_sign_of_a_card_is_a_card_seen(key: str) -> None:
    seen = {**NO_CARD, key: SPEC_RUN[key]}
    assert not saw_no_card(seen)
    assert saw_no_card(NO_CARD)


@pytest.mark.parametrize(
    ("gpu", "name", "matches"),
    [("L4", "NVIDIA 2L4", False), ("L4", "NVIDIA 2xL4", True), ("L4", "L4", True)],
)
def test_a_model_number_is_not_read_out_of_a_longer_one(gpu: str, name: str, matches: bool) -> None:
    assert gpu_type_matches(gpu, name) is matches
