"""The dashboard's pure parts: the pools' chart, why a task waits, every value escaped."""

from __future__ import annotations

import re

from levers9.dashboard import views
from levers9.dashboard.html import table
from levers9.proto import gateway_pb2

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
