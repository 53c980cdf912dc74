"""The dashboard's HTML: small server-rendered pages (every value escaped here), htmx and the
dashboard's own script for the live parts."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC
from urllib.parse import quote, urlencode

from google.protobuf.timestamp_pb2 import Timestamp

ENDED = frozenset({"succeeded", "failed", "cancelled", "lost"})


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def when(message: object, field: str) -> str:
    """A Timestamp field as `YYYY-MM-DD HH:MM:SS` UTC; `-` when unset."""
    if not message.HasField(field):  # type: ignore[attr-defined]
        return "-"
    stamp: Timestamp = getattr(message, field)
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")


def path(*parts: str, **query: str) -> str:
    url = "/ui/" + "/".join(quote(part, safe="") for part in parts)
    kept = {key: value for key, value in query.items() if value}
    return url + ("?" + urlencode(kept) if kept else "")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str, test_id: str) -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty" data-testid="{test_id}-empty">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return (
        f'<table data-testid="{test_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def csrf_field(csrf: str) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(csrf)}">'


def live(source: str, content: str, test_id: str) -> str:
    """A part of a page the server pushes again whenever it changes (`/ui/events`)."""
    return f'<div class="live" data-live="{esc(source)}" data-testid="{test_id}">{content}</div>'


NAV = (("tasks", "Tasks"), ("pools", "Pools"), ("endpoints", "Endpoints"), ("boxes", "Boxes"))


def page(
    title: str,
    body: str,
    *,
    who: str = "",
    operator: bool = False,
    csrf: str = "",
    current: str = "",
) -> str:
    nav = ""
    if who:
        links = [*NAV, ("workspaces", "Workspaces")] if operator else list(NAV)
        items = "".join(
            f'<a href="/ui/{key}"{" class=current" if key == current else ""}>{label}</a>'
            for key, label in links
        )
        nav = (
            f"<nav>{items}<span class=who data-testid=who>{esc(who)}</span>"
            f'<form method="post" action="/ui/sign-out">{csrf_field(csrf)}'
            '<button type="submit">Sign out</button></form></nav>'
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · levers9</title>"
        '<link rel="stylesheet" href="/ui/static/style.css">'
        '<script src="/ui/static/htmx.min.js" defer></script>'
        '<script src="/ui/static/dashboard.js" defer></script>'
        f'</head><body><header><a class="brand" href="/ui/">levers9</a>{nav}</header>'
        '<div id="offline" hidden>The controlplane cannot be reached; retrying…</div>'
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def problem(message: str) -> str:
    return f'<p class="problem" role="alert" data-testid="problem">{esc(message)}</p>'


def sign_in(csrf: str, error: str = "") -> str:
    body = (
        (problem(error) if error else "")
        + '<form method="post" action="/ui/sign-in" class="sign-in">'
        + csrf_field(csrf)
        + '<label>Token <input type="password" name="token" autocomplete="off" required'
        ' autofocus data-testid="token"></label>'
        '<button type="submit" data-testid="sign-in">Sign in</button></form>'
        "<p class=hint>A workspace's token (<code>levers9 workspace token create NAME</code>)"
        " or the operator's (<code>levers9 dev up</code> writes it): the CLI's tokens.</p>"
    )
    return page("Sign in", body)
