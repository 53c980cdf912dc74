"""The dashboard's pure parts: the pools' chart, why a task waits, every value escaped, the
links to the Temporal UI and to a box's ports, `temporalUiUrl`'s check and `dev up`'s value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from levers9.config.settings import ControlplaneSettings
from levers9.dashboard import views
from levers9.dashboard.html import table
from levers9.devstack.options import DevOptions
from levers9.devstack.stack import DevStack
from levers9.proto import boxes_pb2, endpoints_pb2, gateway_pb2, worker_pb2

HOUR = 3600.0


def test_the_chart_draws_cards_in_use_and_tasks_waiting_over_the_window() -> None:
    now = 10 * HOUR
    samples = [
        (now - 4 * HOUR, 4, 4, 9),  # out of the 3 h window: not drawn
        (now - 3 * HOUR, 0, 4, 0),
        (now - 1.5 * HOUR, 2, 4, 2),
        (now, 4, 4, 1),
    ]
    drawn = views.chart(samples, now, 3 * HOUR, "chart-p")
    cards, waiting = re.findall(r'points="([^"]+)"', drawn)
    # x: the window's start at 0, now at 600; y: 80 is none, 0 the most (4 cards; 2 waiting).
    assert cards.split() == ["0.0,80.0", "300.0,40.0", "600.0,0.0"]
    assert waiting.split() == ["0.0,80.0", "300.0,0.0", "600.0,40.0"]
    assert "now 4 in use, 1 waiting" in drawn


def test_the_chart_says_it_fills_in_until_it_has_two_samples() -> None:
    drawn = views.chart([(0.0, 1, 4, 0)], 1.0, 3 * HOUR, "chart-p")
    assert "fills in while this page is open" in drawn
    assert "<svg" not in drawn


def test_a_task_waiting_on_its_quota_or_on_cards_says_which() -> None:
    quota = gateway_pb2.TaskRecord(
        state="queued",
        workspace="team-a",
        queue=gateway_pb2.TaskQueueSpot(position=2, waiting=3, reason="quota"),
    )
    assert views.waits(quota) == "workspace team-a holds its GPU quota (position 2 of 3)"
    cards = gateway_pb2.TaskRecord(
        state="queued",
        queue=gateway_pb2.TaskQueueSpot(position=1, waiting=1, gpus=4, most_free=2, workers=3),
    )
    assert views.waits(cards) == (
        "waiting for 4 card(s): the most free on one of 3 worker(s) is 2 (position 1 of 1)"
    )
    assert views.waits(gateway_pb2.TaskRecord(state="running")) == ""


def test_a_tasks_values_are_escaped_in_its_row() -> None:
    record = gateway_pb2.TaskRecord(
        task_id="abc", command=["echo", "<script>alert(1)</script>"], state="running"
    )
    shown = views.task_rows([record], operator=False, next_page="")
    assert "<script>" not in shown
    assert "&lt;script&gt;" in shown
    assert 'data-testid="x-empty"' in table(["A"], [], "none", "x")


UI = "http://127.0.0.1:8233"


def test_each_workflow_backed_object_links_to_its_workflow_in_the_temporal_ui() -> None:
    temporal = views.Temporal(UI, "default")
    task = views.task_spec(gateway_pb2.TaskRecord(task_id="abc123"), temporal)
    assert f'href="{UI}/namespaces/default/workflows/task%3Aabc123"' in task
    endpoint = endpoints_pb2.EndpointView(name="chat")
    shown = views.endpoint_rows([endpoint], "https://front", temporal)
    assert f'href="{UI}/namespaces/default/workflows/endpoint%3Achat"' in shown
    box = boxes_pb2.Box(name="dev", workspace="team-a", state="running")
    shown = views.box_rows([box], "https://front", False, temporal)
    assert f'href="{UI}/namespaces/default/workflows/box%3Ateam-a%3Adev"' in shown
    assert 'target="_blank"' in shown
    # Without temporalUiUrl: no link, no column.
    assert "workflows" not in views.task_spec(gateway_pb2.TaskRecord(task_id="abc123"))
    assert "Workflow" not in views.endpoint_rows([endpoint], "https://front")
    assert views.Temporal().link("task:abc") == ""


def test_a_boxs_ports_link_to_its_urls_on_the_endpoints_front() -> None:
    box = boxes_pb2.Box(
        name="web",
        workspace="team-a",
        state="running",
        task_id="t1",
        task_state="running",
        task=gateway_pb2.SubmitTaskRequest(task=worker_pb2.TaskSpec(ports=[8080, 8888])),
    )
    shown = views.box_rows([box], "https://front:7480", True, views.Temporal())
    assert 'href="https://front:7480/box/team-a/web/8080/"' in shown
    assert 'href="https://front:7480/box/team-a/web/8888/"' in shown
    assert 'href="/ui/tasks/t1"' in shown
    assert "<th>Workspace</th>" in shown
    bare = views.box_rows([boxes_pb2.Box(name="b", workspace="w")], "https://f", False)
    assert "<th>Workspace</th>" not in bare
    assert "No box" in views.box_rows([], "https://f", False)


@pytest.mark.parametrize("given", ["127.0.0.1:8233", "ftp://host", "http://", "not a url"])
def test_temporal_ui_url_must_be_an_http_url(given: str) -> None:
    with pytest.raises(ValidationError, match=r"temporalUiUrl: .* is not an http\(s\) URL"):
        ControlplaneSettings(temporal_ui_url=given)


def test_temporal_ui_url_is_kept_without_its_trailing_slash_and_empty_means_no_links() -> None:
    assert ControlplaneSettings(temporal_ui_url=UI + "/").temporal_ui_url == UI
    assert ControlplaneSettings().temporal_ui_url == ""


def test_dev_up_gives_the_controlplane_the_dev_temporal_servers_ui(tmp_path: Path) -> None:
    stack = DevStack(tmp_path, DevOptions(ui_port=18233))
    given = stack.worker_env()["LEVERS9_TEMPORAL_UI_URL"]
    assert given == stack.env()["LEVERS9_TEMPORAL_UI"] == "http://127.0.0.1:18233"
    assert ControlplaneSettings(temporal_ui_url=given).temporal_ui_url == given
