"""The dashboard (`/ui/` of the endpoints' front) in a real browser: Playwright driving the
system's Chromium against a controlplane on the sandbox, with workspaces `team-a` and `team-b`
and a token each, tasks started by the real CLI.

A workspace token signs in to an HttpOnly, SameSite=Strict, expiring session; the dev pool's
machines appear; a task started with the CLI appears on the open task list without a reload,
and its log lines stream onto its page; a form POST without the CSRF token is refused and
changes nothing; cancel from the page ends the task; another workspace's task is not listed
and its URL answers exactly as a missing task's; the operator sees both teams' tasks and the
workspaces' tokens by label, never a token; each machine's cards free / held by levers9 / held by
neighbours, a cordoned node as draining and why, and the chart the replica samples in the
background; a box created with the CLI is listed with each port a link to its URL; tasks,
endpoints, workspaces and boxes link to their workflows in the Temporal UI (`temporalUiUrl`).

The tests of this module share one sandbox, one controlplane and one browser, in order. With
LEVERS9_SCREENSHOTS=DIR (`make screenshots`: docs/dashboard/) they also save each page there,
as docs/dashboard.md shows them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from kubernetes import client as k8s
from playwright.async_api import Browser, Page, async_playwright, expect
from temporalio.testing import WorkflowEnvironment

from levers9.rpc import tls
from levers9.tokens import operator_token
from tests.controlplane import POOL, TOKEN_SECRET, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
HAS_CHROMIUM = Path(CHROMIUM).exists()
WITHIN = 60
SHOWN_S = 10
"""The browser's bound on a pushed change reaching the page (the page pushes each second)."""
SCREENSHOTS = os.environ.get("LEVERS9_SCREENSHOTS", "")
LINES_TASK = (
    "import time\nfor i in range(100000):\n    print('dashboard line', i, flush=True)\n"
    "    time.sleep(0.3)"
)
TEMPORAL_UI = "http://127.0.0.1:8233"
"""The fixture's `temporalUiUrl` (the links' base; the page does not fetch it)."""


@dataclass
class Board:
    cp: Controlplane
    browser: Browser
    a: str
    b: str
    url: str
    tasks: dict[str, str] = field(default_factory=dict)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
async def board(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Board]:
    if not HAS_CHROMIUM:
        pytest.fail("no /usr/bin/chromium: apt-get install chromium (.ci/run installs it)")
    async with (
        reconciling(
            dev_env.client,
            tmp_path_factory.mktemp("dashboard"),
            containers=True,
            temporalUiUrl=TEMPORAL_UI,
        ) as cp,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            await eventually(lambda: workers_available(cp), within=WITHIN)
            tokens = []
            for team in ("team-a", "team-b"):
                _ok(await cp.cli("workspace", "create", team, "--gpu-quota", "2"))
                made = await cp.cli("workspace", "token", "create", team, "--name", "ci")
                tokens.append(_ok(made).strip())
            url = cp.settings.endpoints_base_url() + "/ui/"
            yield Board(cp, browser, tokens[0], tokens[1], url)
        finally:
            await browser.close()


def _workflow(board: Board, workflow_id: str) -> str:
    namespace = board.cp.settings.temporal_namespace
    return f"{TEMPORAL_UI}/namespaces/{namespace}/workflows/{quote(workflow_id, safe='')}"


async def _snap(page: Page, name: str) -> None:
    """The page as docs/dashboard.md shows it (only with LEVERS9_SCREENSHOTS set)."""
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


async def _signed_in(board: Board, token: str) -> Page:
    context = await board.browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(board.url)
    await expect(page).to_have_url(board.url + "sign-in")
    await _snap(page, "sign-in")
    await page.get_by_test_id("token").fill(token)
    await page.get_by_test_id("sign-in").click()
    await expect(page).to_have_url(board.url + "tasks")
    return page


async def test_a_workspace_token_signs_in_to_a_strict_http_only_expiring_session(
    board: Board,
) -> None:
    page = await _signed_in(board, board.a)
    await expect(page.get_by_test_id("who")).to_contain_text("workspace team-a (ci)")
    [session] = [c for c in await page.context.cookies() if c["name"] == "l9_session"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert time.time() < session["expires"] < time.time() + 9 * 3600
    assert board.a not in session["value"]  # sealed: the browser never holds the token
    # A wrong token is refused on the page, saying why, and signs nobody in.
    other = await (await board.browser.new_context()).new_page()
    await other.goto(board.url + "sign-in")
    await other.get_by_test_id("token").fill("l9ws_team-a_nope_nope")
    await other.get_by_test_id("sign-in").click()
    await expect(other.get_by_test_id("problem")).to_contain_text("not signed in")
    assert not [c for c in await other.context.cookies() if c["name"] == "l9_session"]
    # Signing out ends the session: the pages ask for a sign-in again.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(board.url + "sign-in")
    await page.goto(board.url + "pools")
    await expect(page).to_have_url(board.url + "sign-in")


async def test_the_dev_pools_machines_appear(board: Board) -> None:
    """Each machine's cards free / held by levers9's worker / held by neighbours, as the
    machine records (`levers9 machine list`) count them: the scenario's model server holds two
    cards of the four-card node."""
    listed = json.loads(_ok(await board.cp.cli("machine", "list", "--pool", POOL, "-o", "json")))
    nodes = {m["node_name"] for m in listed}
    assert nodes
    assert sorted(m["neighbour_gpus"] for m in listed if m["total_gpus"] == 4) == [2]
    page = await _signed_in(board, board.a)
    await page.goto(board.url + "pools")
    machines = page.get_by_test_id("machines")
    for m in listed:
        node = m["node_name"]
        await expect(machines).to_contain_text(node)
        await expect(page.get_by_test_id(f"free-{node}")).to_have_text(str(m["free_gpus"]))
        await expect(page.get_by_test_id(f"ours-{node}")).to_have_text(str(m["worker_gpus"]))
        theirs = page.get_by_test_id(f"neighbours-{node}")
        await expect(theirs).to_have_text(str(m["neighbour_gpus"]))
    await expect(page.get_by_test_id(f"pool-{POOL}")).to_contain_text("card(s) free")


async def test_the_chart_is_sampled_in_the_background_and_drawn(board: Board) -> None:
    """The replica samples each pool from its start, no page open; the page draws the
    samples (a second round taken now rather than in 30 s)."""
    dashboard = board.cp.dashboard
    assert dashboard is not None
    assert dashboard.samples is not None
    samples = dashboard.samples

    async def sampled() -> bool:
        return len(samples.of(POOL)) >= 1

    await eventually(sampled, within=WITHIN)
    await samples.sample()
    _, in_use, cards, _ = samples.of(POOL)[-1]
    assert cards > 0  # the workers' cards, as the pool places them
    assert 0 <= in_use <= cards
    page = await _signed_in(board, board.a)
    await page.goto(board.url + "pools")
    chart = page.get_by_test_id(f"chart-{POOL}")
    await expect(chart.locator("polyline")).to_have_count(2)
    await expect(chart).to_contain_text("cards in use")
    await _snap(page, "pools")


async def test_a_task_started_with_the_cli_appears_live_and_its_logs_stream(board: Board) -> None:
    page = await _signed_in(board, board.a)
    await expect(page.get_by_test_id("task-list")).to_be_attached()
    done = await board.cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--detach", "--", "python", "-c", LINES_TASK,
        token=board.a,
    )  # fmt: skip
    task_id = _ok(done).strip()
    board.tasks["a"] = task_id
    # Pushed onto the open list: no reload.
    link = page.get_by_role("link", name=task_id)
    await expect(link).to_be_visible(timeout=SHOWN_S * 1000)
    await link.click()
    await expect(page).to_have_url(board.url + f"tasks/{task_id}")
    logs = page.get_by_test_id("logs")
    await expect(logs).to_contain_text("dashboard line 0", timeout=WITHIN * 1000)
    await expect(logs).to_contain_text("dashboard line 3", timeout=WITHIN * 1000)
    await expect(page.get_by_test_id("state")).to_have_text("running")
    await expect(page.get_by_test_id("timeline")).to_contain_text("container.start")
    await expect(page.locator(".cli code").first).to_contain_text("levers9 run --pool")
    workflow = page.get_by_test_id(f"temporal-task:{task_id}")
    await expect(workflow).to_have_attribute("href", _workflow(board, f"task:{task_id}"))
    await _snap(page, "task")


async def test_a_form_without_the_csrf_token_is_refused_and_changes_nothing(board: Board) -> None:
    task_id = board.tasks["a"]
    page = await _signed_in(board, board.a)
    cancel = board.url + f"tasks/{task_id}/cancel"
    bare = await page.request.post(cancel, form={}, max_redirects=0)
    assert bare.status == 403
    assert "CSRF" in await bare.text()
    # Another session's token is no better.
    other = await _signed_in(board, board.a)
    await other.goto(board.url + f"tasks/{task_id}")
    theirs = await other.locator("input[name=csrf]").first.get_attribute("value")
    assert theirs
    forged = await page.request.post(cancel, form={"csrf": theirs}, max_redirects=0)
    assert forged.status == 403
    got = json.loads(_ok(await board.cp.cli("task", "get", task_id, "-o", "json")))
    assert got["state"] == "running"


async def test_cancel_from_the_page_ends_the_task(board: Board) -> None:
    task_id = board.tasks["a"]
    page = await _signed_in(board, board.a)
    await page.goto(board.url + f"tasks/{task_id}")
    await page.get_by_test_id("cancel").click()
    await expect(page.get_by_test_id("state")).to_have_text("cancelled", timeout=WITHIN * 1000)
    got = json.loads(_ok(await board.cp.cli("task", "get", task_id, "-o", "json")))
    assert got["state"] == "cancelled"


async def test_another_workspaces_task_is_not_listed_and_its_url_answers_not_found(
    board: Board,
) -> None:
    done = await board.cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--detach", "--", "python", "-c", LINES_TASK,
        token=board.b,
    )  # fmt: skip
    board.tasks["b"] = _ok(done).strip()
    page = await _signed_in(board, board.b)
    # Proof the list could show it: team B's own task is listed.
    await expect(page.get_by_role("link", name=board.tasks["b"])).to_be_visible(
        timeout=SHOWN_S * 1000
    )
    await expect(page.get_by_role("link", name=board.tasks["a"])).to_have_count(0)
    theirs = await page.goto(board.url + f"tasks/{board.tasks['a']}")
    assert theirs is not None
    theirs_text = await page.get_by_test_id("problem").inner_text()
    missing_id = board.tasks["a"][:-4] + "0000"
    none = await page.goto(board.url + f"tasks/{missing_id}")
    assert none is not None
    none_text = await page.get_by_test_id("problem").inner_text()
    assert theirs.status == none.status == 404
    assert theirs_text.replace(board.tasks["a"], "ID") == none_text.replace(missing_id, "ID")
    stream = await page.request.get(board.url + f"tasks/{board.tasks['a']}/logs/stream")
    assert stream.status == 404


async def test_the_operator_sees_both_teams_and_their_tokens_by_label(board: Board) -> None:
    page = await _signed_in(board, operator_token(TOKEN_SECRET))
    await expect(page.get_by_test_id("who")).to_have_text("operator")
    listed = page.get_by_test_id("tasks")
    for task_id in board.tasks.values():
        await expect(listed).to_contain_text(task_id)
    await expect(listed).to_contain_text("team-b")
    await _snap(page, "tasks")
    # An endpoint of team-b (no replica until a request): listed with its URL, to the operator.
    _ok(
        await board.cp.cli(
            "endpoint", "create", "echo-b", "--pool", POOL, "--gpus", "0", "--port", "8080",
            "--workspace", "team-b", "--", "python", "-m", "http.server", "8080",
        )
    )  # fmt: skip
    await page.get_by_role("link", name="Endpoints").click()
    endpoints = page.get_by_test_id("endpoints")
    await expect(endpoints).to_contain_text("echo-b")
    await expect(endpoints).to_contain_text(board.cp.settings.endpoints_base_url() + "/echo-b/")
    await expect(endpoints).to_contain_text("0 ready / 0 starting")
    workflow = endpoints.get_by_test_id("temporal-endpoint:echo-b")
    await expect(workflow).to_have_attribute("href", _workflow(board, "endpoint:echo-b"))
    await _snap(page, "endpoints")
    await page.get_by_role("link", name="Workspaces").click()
    for team in ("team-a", "team-b"):
        await expect(page.get_by_test_id(f"tokens-{team}")).to_contain_text("ci")
        workflow = page.get_by_test_id(f"temporal-workspace:{team}")
        await expect(workflow).to_have_attribute("href", _workflow(board, f"workspace:{team}"))
    await _snap(page, "workspaces")
    content = await page.content()
    assert board.a not in content
    assert board.b not in content
    # The operator's workspace filter.
    await page.goto(board.url + "tasks?workspace=team-b")
    listed = page.get_by_test_id("tasks")
    await expect(listed).to_contain_text(board.tasks["b"])
    await expect(listed).not_to_contain_text(board.tasks["a"])
    _ok(await board.cp.cli("task", "cancel", board.tasks["b"]))


async def test_a_box_is_listed_with_its_ports_as_links_for_its_workspace_only(
    board: Board,
) -> None:
    create = ("box", "create", "web", "--pool", POOL, "--gpus", "0", "--port", "8080")
    _ok(await board.cp.cli(*create, token=board.a))
    try:
        page = await _signed_in(board, board.a)
        await page.get_by_role("link", name="Boxes").click()
        boxes = page.get_by_test_id("boxes")
        await expect(boxes).to_contain_text("web")
        port = boxes.get_by_test_id("box-port-web-8080")
        url = board.cp.settings.endpoints_base_url() + "/box/team-a/web/8080/"
        await expect(port).to_have_attribute("href", url)
        workflow = boxes.get_by_test_id("temporal-box:team-a:web")
        await expect(workflow).to_have_attribute("href", _workflow(board, "box:team-a:web"))
        await _snap(page, "boxes")
        # Another workspace's page lists none of it.
        theirs = await _signed_in(board, board.b)
        await theirs.goto(board.url + "boxes")
        await expect(theirs.get_by_test_id("boxes-empty")).to_be_visible()
    finally:
        _ok(await board.cp.cli("box", "delete", "web", token=board.a))


async def test_the_operator_creates_a_workspace_and_a_token_and_revokes_it(board: Board) -> None:
    page = await _signed_in(board, operator_token(TOKEN_SECRET))
    await page.goto(board.url + "workspaces")
    await page.get_by_placeholder("GPU quota (empty: none)").fill("lots")
    await page.get_by_placeholder("name", exact=True).fill("team-c")
    await page.get_by_role("button", name="Create workspace").click()
    await expect(page.get_by_test_id("problem")).to_contain_text("GPU quota: a whole number")
    await page.goto(board.url + "workspaces")
    await page.get_by_placeholder("name", exact=True).fill("team-c")
    await page.get_by_placeholder("GPU quota (empty: none)").fill("1")
    await page.get_by_role("button", name="Create workspace").click()
    section = page.get_by_test_id("workspace-team-c")
    await expect(section).to_contain_text("GPU quota 1")
    await section.get_by_placeholder("label").fill("laptop")
    await section.get_by_role("button", name="Create token").click()
    token = (await page.get_by_test_id("new-token").inner_text()).strip()
    tokens = await board.cp.cli("workspace", "token", "list", "team-c", "-o", "json")
    listed = json.loads(_ok(tokens))
    assert [t["label"] for t in listed] == ["laptop"]
    # The new token signs in to team-c's own view; a workspace token has no Workspaces page.
    theirs = await _signed_in(board, token)
    await expect(theirs.get_by_test_id("who")).to_contain_text("workspace team-c (laptop)")
    await expect(theirs.get_by_role("link", name="Workspaces")).to_have_count(0)
    await theirs.goto(board.url + "endpoints")
    await expect(theirs.get_by_test_id("endpoints-empty")).to_have_text("No endpoint.")
    refused = await theirs.goto(board.url + "workspaces")
    assert refused is not None
    assert refused.status == 403
    # Revoked from the page: its session ends within the Authority's bound.
    await page.goto(board.url + "workspaces")
    await page.get_by_test_id("workspace-team-c").get_by_role("button", name="Revoke").click()
    await expect(page.get_by_test_id("tokens-team-c")).to_contain_text("revoked")

    async def signed_out() -> bool:
        await theirs.goto(board.url + "tasks")
        return (
            theirs.url == board.url + "sign-in"
            or await theirs.get_by_test_id("problem").filter(has_text="signed out").count() > 0
        )

    await eventually(signed_out, within=WITHIN)


async def test_levers9_ui_prints_the_dashboards_url(board: Board) -> None:
    done = await board.cp.cli("ui", "--no-open")
    assert _ok(done).strip() == board.url


async def test_a_page_whose_front_stops_says_so_and_recovers_by_itself(board: Board) -> None:
    """The endpoints' front (and so the dashboard) stops with a task page open: its streams end
    at once rather than holding the stop, the page says the controlplane cannot be reached, and
    once the front serves again the page's streams reconnect by themselves. Near the end: the
    front's endpoint views stay stopped after this."""
    cp = board.cp
    assert cp.endpoints is not None
    page = await _signed_in(board, board.a)
    await page.goto(board.url + f"tasks/{board.tasks['a']}")
    offline = page.locator("#offline")
    await expect(page.get_by_test_id("logs")).to_contain_text("dashboard line 0")
    await expect(offline).to_be_hidden()
    async with asyncio.timeout(WITHIN / 2):  # not the front's 60 s shutdown timeout
        await cp.endpoints.stop()
    try:
        await expect(offline).to_be_visible(timeout=SHOWN_S * 1000)
    finally:
        await cp.endpoints.start(
            cp.settings.endpoints_listen, tls.endpoints_ssl_context(cp.settings)
        )
    await expect(offline).to_be_hidden(timeout=SHOWN_S * 1000)


async def test_a_cordoned_node_shows_as_draining_with_why(board: Board) -> None:
    """Last: a cordoned node's worker is drained, and the tests before read its tasks' logs."""
    listed = json.loads(_ok(await board.cp.cli("machine", "list", "--pool", POOL, "-o", "json")))
    [node] = [m["node_name"] for m in listed if m["total_gpus"] == 1]
    page = await _signed_in(board, operator_token(TOKEN_SECRET))
    await page.goto(board.url + "pools")
    state = page.get_by_test_id(f"state-{node}")
    await expect(state).to_have_text("Healthy")
    await _cordon(board.cp, node, True)
    try:
        await expect(state).to_have_text("draining", timeout=WITHIN * 1000)
        row = page.get_by_test_id("machines").locator("tr", has_text=node)
        await expect(row).to_contain_text("cordoned: draining, no new worker")
    finally:
        await _cordon(board.cp, node, False)
    await expect(state).to_have_text("Healthy", timeout=WITHIN * 1000)


async def _cordon(cp: Controlplane, node: str, cordoned: bool) -> None:
    """`kubectl cordon|uncordon`, as the admin (the pool's key may not change nodes)."""
    patch = {"spec": {"unschedulable": cordoned}}
    await cp.admin(lambda api: k8s.CoreV1Api(api).patch_node(node, patch))
