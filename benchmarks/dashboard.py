"""The dashboard's two costs (issue 40): the task list of 10,000 tasks, served page by page, in
server time; and what one idle open page costs the controlplane's process.

    python benchmarks/dashboard.py [--tasks 10000] [--requests 50] [--idle-s 30]

The dashboard (levers9/dashboard) runs as the controlplane runs it, over the gateway's real
TasksService (its ListTasks, its page cursors and the Authority's check of the operator token),
served over HTTP by aiohttp's low-level server as the endpoints' front serves `/ui/`. Only the
task records stand in for Temporal's visibility: 10,000 `TaskRecord`s in memory, read a page at
a time as `TemporalTaskRecords.page` reads them (the time a visibility query of 100 memos takes
on the Temporal server is not in these figures).

1. Server time (from the request entering `Dashboard.handle` to its response) of the first page,
   of page 50 (following the list's own next links) and of a filtered page (state=running, text
   filter), p50 and p99, each rendering its rows afresh (the rows' cache emptied before each).
   Target: under 300 ms.
2. The process's CPU (user+system) over `--idle-s` seconds with nothing open, then with one
   tasks page's live stream open (`/ui/events`: it renders its part each second and sends it
   only on a change; the records do not change here, so after the first push each second is a
   ListTasks page and a digest of it, the rows coming from the cache), as a share of one core.
   Target: under 1%.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from datetime import UTC, datetime, timedelta

import aiohttp
from aiohttp import web
from pydantic import SecretStr
from yarl import URL

from levers9.core.task_reports import TaskPhase
from levers9.dashboard.app import Dashboard
from levers9.dashboard.calls import Services
from levers9.dashboard.sessions import PRE_COOKIE, SESSION_COOKIE
from levers9.gateway.task_service import TasksService
from levers9.models import TaskRecord
from levers9.tokens import operator_token

SECRET = "bench-secret-" + "x" * 32
STATES = ("succeeded", "failed", "cancelled", "running", "queued")


class MemoryRecords:
    """Stands in for TemporalTaskRecords' reads: `tasks` records, newest first, paged."""

    def __init__(self, tasks: int) -> None:
        start = datetime(2026, 12, 1, tzinfo=UTC)
        self._records = [
            TaskRecord(
                task_id=f"{i:012x}",
                pool_name="gke-rtx6000",
                command=("python", "-c", f"print('task {i}')"),
                gpus=i % 4,
                image="",
                state=STATES[i % len(STATES)],
                created_at=start + timedelta(seconds=i),
                workspace=f"team-{i % 20}",
                node_name=f"gke-node-{i % 200}",
                phases=(TaskPhase(name="placement", at=start + timedelta(seconds=i)),),
                reason="" if i % 3 else "exited 1",
            )
            for i in reversed(range(tasks))
        ]

    async def page(
        self,
        pool_name: str | None,
        page_size: int,
        page_token: bytes,
        workspace: str | None = None,
    ) -> tuple[list[TaskRecord], bytes]:
        start = int(page_token or b"0")
        chosen = self._records
        if workspace is not None:
            chosen = [r for r in chosen if r.workspace == workspace]
        end = start + page_size
        return chosen[start:end], (str(end).encode() if end < len(chosen) else b"")


def _timed(dashboard: Dashboard, spent: list[float]) -> web.Server:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        response = await dashboard.handle(request)
        if not request.path.startswith("/ui/events"):
            spent.append((time.perf_counter() - started) * 1000)
        return response

    return web.Server(handle)


def _quantiles(spent: list[float]) -> str:
    p99 = statistics.quantiles(spent, n=100)[98] if len(spent) > 1 else spent[0]
    return f"p50 {statistics.median(spent):.1f} ms, p99 {p99:.1f} ms ({len(spent)} requests)"


async def _sign_in(session: aiohttp.ClientSession, base: str) -> None:
    page = await (await session.get(base + "/ui/sign-in")).text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    assert session.cookie_jar.filter_cookies(URL(base + "/ui/sign-in"))[PRE_COOKIE]
    form = {"csrf": csrf.group(1), "token": operator_token(SECRET, 1)}
    answer = await session.post(base + "/ui/sign-in", data=form, allow_redirects=False)
    assert answer.status == 303, await answer.text()
    assert session.cookie_jar.filter_cookies(URL(base + "/ui/tasks"))[SESSION_COOKIE]


async def _pages(
    session: aiohttp.ClientSession, base: str, first: str, count: int
) -> tuple[str, int]:
    """Follows the list's next links `count` times from `first`; the last URL and its rows."""
    url = first
    for _ in range(count):
        text = await (await session.get(base + url)).text()
        found = re.search(r'href="(/ui/tasks\?[^"]*page=[^"]*)" data-testid="next-page"', text)
        assert found is not None, "no next page"
        url = found.group(1).replace("&amp;", "&")
    text = await (await session.get(base + url)).text()
    return url, text.count("<tr>") - 1


async def main(tasks: int, requests: int, idle_s: float) -> None:
    records = MemoryRecords(tasks)
    service = TasksService(records, SecretStr(SECRET))  # type: ignore[arg-type]
    dashboard = Dashboard(Services(service, None, None, None), SecretStr(SECRET))
    spent: list[float] = []
    runner = web.ServerRunner(_timed(dashboard, spent))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            await _sign_in(session, base)
            for name, url in (
                ("first page", "/ui/tasks"),
                ("page 50", (await _pages(session, base, "/ui/tasks", 49))[0]),
                ("filtered page (state=running, text)", "/ui/tasks?state=running&q=node-1"),
            ):
                spent.clear()
                for _ in range(requests):
                    dashboard._rendered.clear()  # each request renders its rows afresh
                    answer = await session.get(base + url)
                    assert answer.status == 200, await answer.text()
                    await answer.read()
                print(f"{name}: {_quantiles(spent)}")
            before = time.process_time()
            await asyncio.sleep(idle_s)
            idle = time.process_time() - before
            stream = await session.get(
                base + "/ui/events", params={"src": "/ui/tasks/rows"}, timeout=None
            )
            await stream.content.readuntil(b"\n\n")  # its first push, the part as it is
            before = time.process_time()
            await asyncio.sleep(idle_s)
            open_page = time.process_time() - before
            stream.close()
            print(
                f"CPU with nothing open: {idle / idle_s:.2%} of one core; with one tasks page"
                f" open ({tasks} tasks, its part rendered each second): {open_page / idle_s:.2%}"
            )
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.requests, args.idle_s))
