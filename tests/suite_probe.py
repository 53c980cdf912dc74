"""Not collected by the suite (no test_ prefix): tests/unit/test_suite_report.py runs it in a
pytest of its own to see the suite's report and CI's rule on skips act on a real run."""

import os

import pytest


def test_passes() -> None:
    assert os.environ.get("LEVERS9_SUITE_PROBE") == "1"


@pytest.mark.skipif(os.environ.get("LEVERS9_SUITE_PROBE") == "1", reason="probe skip in setup")
def test_skipped_by_mark() -> None:
    raise AssertionError("the probe's mark should have skipped this")


def test_skipped_in_body() -> None:
    pytest.skip("probe skip in the body")


def test_fails() -> None:
    assert os.environ.get("LEVERS9_SUITE_PROBE_FAIL") != "1", "probe failure"


@pytest.mark.integration
def test_fails_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fails its first run, passes its second: counted once as ran, named as run again."""
    marker = tmp_path_factory.getbasetemp().parent / "probe-failed-once"
    if os.environ.get("LEVERS9_SUITE_PROBE_FAIL") == "1" and not marker.exists():
        marker.write_text("1")
        raise AssertionError("probe first run")


@pytest.mark.integration
def test_fails_always() -> None:
    assert os.environ.get("LEVERS9_SUITE_PROBE_FAIL") != "1", "probe failure, twice"
