"""The dashboard's pure parts: the pools' chart and its background samples, a machine's cards
free / held by levers9 / held by neighbours and why a node is not a machine, why a task waits,
every value escaped, the links to the Temporal UI and to a box's ports, `temporalUiUrl`'s check
and `dev up`'s value."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from levers9.config.settings import ControlplaneSettings
from levers9.core.pool_usage import PoolUsage
from levers9.dashboard import views
from levers9.dashboard.html import table
from levers9.dashboard.samples import PoolSamples
from levers9.devstack.options import DevOptions
from levers9.devstack.stack import DevStack
from levers9.proto import boxes_pb2, endpoints_pb2, gateway_pb2, pools_pb2, worker_pb2
from tests.waiting import eventually

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


def test_the_chart_spans_its_samples_until_they_span_the_window() -> None:
    now = 10 * HOUR
    drawn = views.chart([(now - 600, 0, 4, 0), (now, 4, 4, 0)], now, 6 * HOUR, "chart-p")
    cards, _ = re.findall(r'points="([^"]+)"', drawn)
    assert cards.split() == ["0.0,80.0", "600.0,0.0"]
    assert "Last 10 min:" in drawn
    assert "Last 30 s:" in views.chart([(now - 30, 0, 4, 0), (now, 1, 4, 0)], now, HOUR, "c")


def test_the_chart_says_it_fills_in_until_it_has_two_samples() -> None:
    drawn = views.chart([(0.0, 1, 4, 0)], 1.0, 3 * HOUR, "chart-p")
    assert "fills in: this replica samples the pool every 30 s" in drawn
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


def _machine(**fields: object) -> pools_pb2.Machine:
    given: dict[str, object] = {"pool_name": "p", "machine": True, "status": "Healthy"}
    return pools_pb2.Machine(**{**given, **fields})  # type: ignore[arg-type]


def test_a_machines_cards_free_held_by_levers9_and_by_neighbours_are_shown_apart() -> None:
    m = _machine(node_name="n4", total_gpus=4, free_gpus=1, worker_gpus=1, neighbour_gpus=2)
    assert views.cards(m) == (1, 1, 2, 0)
    shown = views.machines([m], "2026-12-05 06:00:00")
    assert '<span data-testid="free-n4">1</span>' in shown
    assert '<span data-testid="ours-n4">1</span>' in shown
    assert '<span data-testid="neighbours-n4">2</span>' in shown
    assert "2026-12-05 06:00:00" in shown  # the pool's last pass: its last reconcile
    # A card the node does not allocate (unhealthy) is none of the three.
    sick = _machine(node_name="n", total_gpus=4, free_gpus=3)
    assert views.cards(sick) == (3, 0, 0, 1)
    assert "4 (1 not allocatable)" in views.machines([sick])


@pytest.mark.parametrize(
    ("status", "state", "why"),
    [
        ("Cordoned", "draining", "cordoned: draining, no new worker"),
        ("NotReady", "NotReady", "the node is not Ready"),
        ("Full", "Full", "no free card: its neighbours hold them all"),
        ("Tainted", "Tainted", "a taint the pool does not tolerate"),
        ("TooSmall", "TooSmall", "less CPU or memory free than a worker asks"),
    ],
)
def test_a_node_that_is_not_a_machine_says_why(status: str, state: str, why: str) -> None:
    m = _machine(node_name="n", machine=False, status=status, total_gpus=2)
    assert views.machine_state(m) == state
    assert views.not_a_machine(m).startswith(why)
    shown = views.machines([m])
    assert f'data-testid="state-n">{state}</span><br><small>{why}' in shown


def test_a_machine_gives_no_reason() -> None:
    assert views.not_a_machine(_machine(node_name="n")) == ""
    assert "<small>" not in views.machines([_machine(node_name="n")])


class _Pools:
    """Pool records as TemporalPoolRecords answers them: names, and each pool's usage or a
    note saying why there is none."""

    def __init__(self) -> None:
        self.names_now = ["a", "b"]
        self.usages: dict[str, PoolUsage | str] = {
            "a": PoolUsage(gpus=4, free_gpus=1, waiting=2, workspaces=[]),
            "b": "its placement did not answer",
        }
        self.reads = 0

    async def names(self) -> list[str]:
        self.reads += 1
        return list(self.names_now)

    async def usage(self, name: str, within: float = 5.0) -> PoolUsage | str:
        return self.usages[name]


async def test_the_samples_keep_each_pools_last_hours_in_a_ring_and_drop_gone_pools() -> None:
    pools, now = _Pools(), [1000.0]
    samples = PoolSamples(pools, every_s=30, window_s=90, clock=lambda: now[0])
    for _ in range(6):
        await samples.sample()
        now[0] += 30
    # (when, in use, cards, waiting); 90 s of 30 s samples: the ring keeps 4.
    assert list(samples.of("a")) == [(t, 3, 4, 2) for t in (1060.0, 1090.0, 1120.0, 1150.0)]
    assert samples.of("b") == ()  # no answer: no sample, not a zero
    assert (samples.rounds, pools.reads) == (6, 6)  # one read of the pools per round
    pools.names_now = ["b"]
    await samples.sample()
    assert "a" not in samples.pools


async def test_the_samples_are_taken_in_the_background_until_the_block_ends() -> None:
    pools = _Pools()
    samples = PoolSamples(pools, every_s=0.01, window_s=1)

    async def three_rounds() -> bool:
        return samples.rounds >= 3

    async with samples:
        await eventually(three_rounds, within=60)
    ended = samples.rounds
    await asyncio.sleep(0.05)  # three rounds' time: none is taken after the block
    assert samples.rounds == ended
