"""What each page shows, from the services' answers (escaped cells, `levers9.dashboard.html`)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from levers9.core.boxes import box_workflow_id
from levers9.core.capacity import NOT_A_MACHINE, MachineStatus
from levers9.dashboard.html import ENDED, csrf_field, esc, path, table, when
from levers9.dashboard.samples import Sample
from levers9.gateway.box_front import box_url
from levers9.models import endpoint_workflow_id, task_workflow_id
from levers9.proto import boxes_pb2, endpoints_pb2, gateway_pb2, pools_pb2

STATES = ("queued", "placed", "running", "succeeded", "failed", "cancelled", "lost")


@dataclass(frozen=True)
class Temporal:
    """Where the Temporal UI shows a workflow (`temporalUiUrl`; empty: no links)."""

    ui_url: str = ""
    namespace: str = "default"

    def url(self, workflow_id: str) -> str:
        if not self.ui_url:
            return ""
        return (
            f"{self.ui_url.rstrip('/')}/namespaces/{quote(self.namespace, safe='')}"
            f"/workflows/{quote(workflow_id, safe='')}"
        )

    def link(self, workflow_id: str) -> str:
        """A link to the workflow in the Temporal UI, or "" without `temporalUiUrl`."""
        url = self.url(workflow_id)
        if not url:
            return ""
        return (
            f'<a class="temporal" href="{esc(url)}" target="_blank" rel="noopener noreferrer"'
            f' data-testid="temporal-{esc(workflow_id)}">{esc(workflow_id)}</a>'
        )


NO_TEMPORAL = Temporal()


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def waits(record: gateway_pb2.TaskRecord) -> str:
    """Why a queued task waits, as `levers9 task get` says it."""
    if record.state != "queued" or not record.HasField("queue"):
        return ""
    spot = record.queue
    if spot.reason == "quota":
        why = f"workspace {spot.workspace or record.workspace} holds its GPU quota"
    elif spot.reason:
        why = spot.reason
    else:
        why = (
            f"waiting for {spot.gpus} card(s): the most free on one of {spot.workers}"
            f" worker(s) is {spot.most_free}"
        )
    return f"{why} (position {spot.position} of {spot.waiting})"


def task_rows(records: Sequence[gateway_pb2.TaskRecord], operator: bool, next_page: str) -> str:
    rows = []
    for r in records:
        link = f'<a href="{esc(path("tasks", r.task_id))}">{esc(r.task_id)}</a>'
        cells = [link]
        if operator:
            cells.append(esc(r.workspace))
        cells += [
            esc(r.pool_name),
            f'<span class="state {esc(r.state)}">{esc(r.state)}</span>',
            esc(r.gpus),
            f"<code>{esc(shlex.join(r.command))}</code>",
            esc(when(r, "created_at")),
            esc(waits(r) or r.reason),
        ]
        rows.append(cells)
    headers = ["Task", *(["Workspace"] if operator else []), "Pool", "State", "GPUs"]
    headers += ["Command", "Created (UTC)", "Reason"]
    shown = table(headers, rows, "No task matches.", "tasks")
    if next_page:
        shown += f'<p><a href="{esc(next_page)}" data-testid="next-page">Next page →</a></p>'
    return shown


def task_filters(state: str, pool: str, text: str, workspace: str, operator: bool) -> str:
    options = "".join(
        f'<option value="{s}"{" selected" if s == state else ""}>{s}</option>'
        for s in ("", *STATES)
    )
    workspace_field = (
        f'<label>Workspace <input name="workspace" value="{esc(workspace)}"></label>'
        if operator
        else ""
    )
    return (
        '<form class="filters" method="get" action="/ui/tasks">'
        f'<label>State <select name="state">{options}</select></label>'
        f'<label>Pool <input name="pool" value="{esc(pool)}"></label>{workspace_field}'
        f'<label>Text <input name="q" value="{esc(text)}" data-testid="filter-text"></label>'
        '<button type="submit">Filter</button></form>'
    )


def cli_run(r: gateway_pb2.TaskRecord) -> str:
    args = ["levers9", "run", "--pool", r.pool_name, "--gpus", str(r.gpus)]
    if r.image:
        args += ["--image", r.image]
    for port in r.ports:
        args += ["--port", str(port)]
    return shlex.join([*args, "--", *r.command])


def task_status(r: gateway_pb2.TaskRecord, csrf: str) -> str:
    """The live part of a task's page: its state, why it waits, its timeline, cancel."""
    facts = [
        ("State", f'<span class="state {esc(r.state)}" data-testid="state">{esc(r.state)}</span>'),
        ("Waits", esc(waits(r)) or "-"),
        ("Reason", esc(r.reason) or "-"),
        ("Exit code", esc(r.exit_code) if r.HasField("exit_code") else "-"),
        ("Node", esc(r.node_name) if r.HasField("node_name") else "-"),
        ("Worker", esc(r.worker_id) if r.HasField("worker_id") else "-"),
        ("GPU indices", esc(", ".join(map(str, r.gpu_indices))) or "-"),
        ("Finished (UTC)", esc(when(r, "finished_at"))),
    ]
    shown = "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    phases = [["queued", esc(when(r, "created_at")), "", ""]]
    phases += [[esc(p.name), esc(when(p, "at")), esc(p.detail), esc(p.error)] for p in r.phases]
    if r.state in ENDED:
        phases.append([esc(r.state), esc(when(r, "finished_at")), esc(r.reason), ""])
    shown += "<h2>Timeline</h2>" + table(
        ["Phase", "At (UTC)", "Detail", "Error"], phases, "No event yet.", "timeline"
    )
    if r.state not in ENDED:
        shown += (
            f'<form method="post" action="{esc(path("tasks", r.task_id, "cancel"))}">'
            f'{csrf_field(csrf)}<button type="submit" class="danger" data-testid="cancel">'
            "Cancel task</button></form>"
        )
    return shown


def task_spec(r: gateway_pb2.TaskRecord, temporal: Temporal = NO_TEMPORAL) -> str:
    spec = [
        ("Workspace", esc(r.workspace)),
        ("Pool", esc(r.pool_name)),
        ("GPUs", esc(r.gpus)),
        ("Image", esc(r.image) or "(the pool's)"),
        ("Command", f"<code>{esc(shlex.join(r.command))}</code>"),
        ("Ports", esc(", ".join(map(str, r.ports))) or "-"),
        ("Retries", esc(r.retries)),
        ("Borrowed", "yes" if r.borrowed else "no"),
        ("Endpoint", esc(r.endpoint) or "-"),
        ("Created (UTC)", esc(when(r, "created_at"))),
    ]
    workflow = temporal.link(task_workflow_id(r.task_id))
    if workflow:
        spec.append(("Workflow", workflow))
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in spec) + "</dl>"


def cli_commands(r: gateway_pb2.TaskRecord) -> str:
    lines = [
        cli_run(r),
        f"levers9 task get {r.task_id}",
        f"levers9 task logs -f {r.task_id}",
        f"levers9 task cancel {r.task_id}",
    ]
    return "".join(
        f'<div class="cli"><code>{esc(line)}</code>'
        f'<button type="button" class="copy" data-copy="{esc(line)}">Copy</button></div>'
        for line in lines
    )


def not_a_machine(m: pools_pb2.Machine) -> str:
    """Why the node is not a machine of its pool (the reconcile's status, in words); "" for a
    machine. Cordoned reads as draining: the pool adds no worker there."""
    if m.machine:
        return ""
    try:
        return NOT_A_MACHINE[MachineStatus(m.status)]
    except ValueError:
        return m.status or "not a machine"


def machine_state(m: pools_pb2.Machine) -> str:
    if m.status in (MachineStatus.CORDONED, MachineStatus.PREEMPTING):
        return "draining"
    return m.status or "-"


def cards(m: pools_pb2.Machine) -> tuple[int, int, int, int]:
    """(free, held by levers9's workers, held by neighbours, not offered) of the node's cards:
    the last is what the node has but does not allocate (an unhealthy card)."""
    rest = m.total_gpus - m.free_gpus - m.worker_gpus - m.neighbour_gpus
    return m.free_gpus, m.worker_gpus, m.neighbour_gpus, max(0, rest)


def machines(found: Sequence[pools_pb2.Machine], last_pass: str = "-") -> str:
    """The pool's nodes: cards free / held by levers9 / held by neighbours, CPU and memory,
    state and why a node is not a machine, its workers; its last reconcile (the pool's last
    pass, which looks at every node) and when its observation last changed."""
    rows = []
    for m in found:
        free, ours, theirs, off = cards(m)
        why = not_a_machine(m)
        state = machine_state(m)
        rows.append(
            [
                esc(m.node_name),
                esc(m.machine_id) or "-",
                esc(m.gpu_type) if m.HasField("gpu_type") else "-",
                esc(m.total_gpus) + (f" ({off} not allocatable)" if off else ""),
                f'<span data-testid="free-{esc(m.node_name)}">{free}</span>',
                f'<span data-testid="ours-{esc(m.node_name)}">{ours}</span>',
                f'<span data-testid="neighbours-{esc(m.node_name)}">{theirs}</span>',
                esc(f"{m.free_cpu_millis / 1000:g}"),
                esc(f"{_mib(m.free_memory_bytes)} of {_mib(m.total_memory_bytes)}"),
                f'<span class="state {esc(state.lower())}" data-testid="state-{esc(m.node_name)}">'
                f"{esc(state)}</span>" + (f"<br><small>{esc(why)}</small>" if why else ""),
                esc(", ".join(m.workers)) or "-",
                esc(last_pass),
                esc(when(m, "observed_at")),
            ]
        )
    headers = ["Node", "Machine", "GPU", "Cards", "Free", "levers9", "Neighbours", "CPU free"]
    headers += ["Memory free", "State", "Workers", "Last reconcile (UTC)", "Changed (UTC)"]
    return table(headers, rows, "No machine yet.", "machines")


def pool_card(pool: pools_pb2.Pool, got: pools_pb2.GetPoolResponse | None) -> str:
    state = "paused" if pool.paused else f"reconciles every {pool.every or '-'}"
    shown = (
        f'<section class="pool" data-testid="pool-{esc(pool.name)}"><h2>{esc(pool.name)}</h2>'
        f"<p>{esc(state)}; {pool.passes} passes, the last at {esc(when(pool, 'last_pass'))}"
        f"{' (joined cluster)' if pool.joined else ''}</p>"
    )
    if got is not None and got.HasField("usage"):
        u = got.usage
        shown += (
            f'<p class="usage">{u.workers} worker(s), {u.free_gpus} of {u.gpus} card(s) free'
            " for tasks,"
            f" {u.placed} task(s) placed, {u.waiting} waiting</p>"
        )
        rows = [
            [
                esc(w.workspace),
                esc(w.gpus),
                esc(w.borrowed_gpus),
                esc(w.gpu_quota) if w.HasField("gpu_quota") else "none",
                esc(w.placed),
                esc(w.waiting),
            ]
            for w in u.workspaces
        ]
        shown += table(
            ["Workspace", "GPUs held", "Borrowed", "Quota", "Placed", "Waiting"],
            rows,
            "No workspace has work here.",
            f"usage-{pool.name}",
        )
    elif got is not None and got.usage_note:
        shown += f"<p>{esc(got.usage_note)}</p>"
    return shown + "</section>"


def endpoint_rows(
    views: Sequence[endpoints_pb2.EndpointView], base_url: str, temporal: Temporal = NO_TEMPORAL
) -> str:
    rows = []
    for v in views:
        ready = sum(1 for r in v.replicas if r.state == "ready")
        starting = sum(1 for r in v.replicas if r.state == "starting")
        url = f"{base_url}/{v.name}/" if base_url else f"/{v.name}/"
        last = v.events[-1] if v.events else None
        rows.append(
            [
                esc(v.name),
                esc(v.spec.workspace),
                esc(v.spec.pool_name),
                f'<a href="{esc(url)}">{esc(url)}</a>' + (" (public)" if v.spec.public else ""),
                f"{ready} ready / {starting} starting (wants {v.wanted})",
                esc(v.in_flight),
                esc(v.waiting),
                esc(v.cold_starts),
                esc(v.failing) or "-",
                esc(f"{last.kind}: {last.message}") if last else "-",
                *([temporal.link(endpoint_workflow_id(v.name))] if temporal.ui_url else []),
            ]
        )
    headers = ["Endpoint", "Workspace", "Pool", "URL", "Replicas", "In flight", "Waiting"]
    headers += ["Cold starts", "Errors", "Last event", *(["Workflow"] if temporal.ui_url else [])]
    return table(headers, rows, "No endpoint.", "endpoints")


def box_rows(
    boxes: Sequence[boxes_pb2.Box], base_url: str, operator: bool, temporal: Temporal = NO_TEMPORAL
) -> str:
    """The caller's boxes: state, task, and each published port as a link to its URL on the
    endpoints' front (`levers9 box ports`)."""
    rows = []
    for b in boxes:
        ports = [
            f'<a href="{esc(url)}" target="_blank" rel="noopener noreferrer"'
            f' data-testid="box-port-{esc(b.name)}-{port}">{port}</a>'
            for port in b.task.task.ports
            for url in [box_url(base_url, b.workspace, b.name, port)]
        ]
        task = (
            f'<a href="{esc(path("tasks", b.task_id))}">{esc(b.task_id)}</a>'
            f" ({esc(b.task_state or '-')})"
            if b.task_id
            else "-"
        )
        cells = [esc(b.name)]
        if operator:
            cells.append(esc(b.workspace))
        cells += [
            f'<span class="state {esc(b.state)}">{esc(b.state)}</span>',
            esc(b.reason) or "-",
            task,
            esc(b.node_name) or "-",
            " ".join(ports) or "-",
            esc(when(b, "last_used_at")),
        ]
        if temporal.ui_url:
            cells.append(temporal.link(box_workflow_id(b.workspace, b.name)))
        rows.append(cells)
    headers = ["Box", *(["Workspace"] if operator else []), "State", "Reason", "Task", "Node"]
    headers += ["Ports", "Last used (UTC)", *(["Workflow"] if temporal.ui_url else [])]
    return table(headers, rows, "No box (levers9 box create).", "boxes")


def token_rows(
    workspace: str, tokens: Sequence[gateway_pb2.WorkspaceTokenRecord], csrf: str
) -> str:
    rows = []
    for t in tokens:
        revoke = "revoked " + when(t, "revoked_at") if t.HasField("revoked_at") else ""
        action = (
            esc(revoke)
            if revoke
            else '<form method="post"'
            f' action="{esc(path("workspaces", workspace, "tokens", t.token_id, "revoke"))}">'
            f'{csrf_field(csrf)}<button type="submit" class="danger">Revoke</button></form>'
        )
        rows.append(
            [
                esc(t.token_id),
                esc(t.label),
                esc(when(t, "created_at")),
                esc(when(t, "expires_at")),
                esc(when(t, "last_used_at")),
                action,
            ]
        )
    return table(
        ["Token id", "Label", "Created", "Expires", "Last used", ""],
        rows,
        "No token.",
        f"tokens-{workspace}",
    )


def chart(samples: Sequence[Sample], now: float, window_s: float, test_id: str) -> str:
    """Cards in use (blue, of the pool's cards) and tasks waiting (orange, of the most seen)
    over the window, as an inline SVG; a note when there are too few samples yet."""
    kept = [s for s in samples if now - s[0] <= window_s]
    if len(kept) < 2:
        return (
            f'<p class="empty" data-testid="{esc(test_id)}">The chart of cards in use and tasks'
            " waiting fills in: this replica samples the pool every 30 s.</p>"
        )
    # Until the samples span the window, the chart spans the samples (a replica that started
    # an hour ago draws its hour across the width).
    window_s = min(window_s, max(now - kept[0][0], 1.0))
    width, height = 600.0, 80.0
    cards = max(max(s[2] for s in kept), 1)
    waiting = max(max(s[3] for s in kept), 1)

    def line(value: int, top: int) -> str:
        return " ".join(
            f"{width * (1 - (now - s[0]) / window_s):.1f},{height - height * (s[value] / top):.1f}"
            for s in kept
        )

    if window_s >= 3600:
        span = f"{window_s / 3600:.3g} h"
    elif window_s >= 120:
        span = f"{window_s / 60:.0f} min"
    else:
        span = f"{window_s:.0f} s"
    return (
        f'<figure data-testid="{esc(test_id)}"><svg viewBox="0 0 {width:g} {height:g}"'
        ' width="600" height="80" role="img" aria-label="cards in use and tasks waiting">'
        f'<rect width="{width:g}" height="{height:g}" fill="#ffffff" stroke="#d9dee7"/>'
        f'<polyline fill="none" stroke="#2f5bd3" stroke-width="2" points="{line(1, cards)}"/>'
        f'<polyline fill="none" stroke="#e07b00" stroke-width="2" points="{line(3, waiting)}"/>'
        f"</svg><figcaption>Last {span}: cards in use (blue, of {cards}) and tasks waiting"
        f" (orange, at most {waiting}); now {kept[-1][1]} in use, {kept[-1][3]} waiting."
        " Sampled by this replica every 30 s.</figcaption></figure>"
    )
