"""Container output behind `GET .../pods/<name>/log`: the kubelet writes, readers read or follow.

The sandbox's kubelet (or a test) appends what a container prints with `write`, and marks the
container finished with `finish`; `kubectl logs` and the official client's
`read_namespaced_pod_log` then see it, `-f` streams it, `--tail`, `--since` and
`--timestamps` work as on a node.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

_Key = tuple[str, str, str]


@dataclass
class _Buffer:
    lines: list[tuple[dt.datetime, str]] = field(default_factory=list)
    partial: str = ""
    finished: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class LogQuery:
    """The `log` subresource's options that shape what is returned."""

    tail_lines: int | None = None
    since: dt.datetime | None = None
    timestamps: bool = False
    limit_bytes: int | None = None


class PodLogs:
    """Per-container output, kept while its pod exists."""

    def __init__(self, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._now = now
        self._buffers: dict[_Key, _Buffer] = {}

    def write(self, namespace: str, pod: str, container: str, text: str) -> None:
        """Appends output; complete lines become visible, a trailing partial line waits."""
        buffer = self._buffers.setdefault((namespace, pod, container), _Buffer())
        data = buffer.partial + text
        *complete, buffer.partial = data.split("\n")
        moment = self._now()
        buffer.lines.extend((moment, line + "\n") for line in complete)
        buffer.changed.set()

    def finish(self, namespace: str, pod: str, container: str) -> None:
        """The container exited: flush a partial line and end followers."""
        buffer = self._buffers.setdefault((namespace, pod, container), _Buffer())
        if buffer.partial:
            buffer.lines.append((self._now(), buffer.partial))
            buffer.partial = ""
        buffer.finished = True
        buffer.changed.set()

    def forget(self, namespace: str, pod: str) -> None:
        """Drops a deleted pod's output and ends anyone following it."""
        for key in [k for k in self._buffers if k[:2] == (namespace, pod)]:
            buffer = self._buffers.pop(key)
            buffer.finished = True
            buffer.changed.set()

    def has(self, namespace: str, pod: str, container: str) -> bool:
        return (namespace, pod, container) in self._buffers

    def read(self, namespace: str, pod: str, container: str, query: LogQuery = LogQuery()) -> str:
        buffer = self._buffers.get((namespace, pod, container))
        if buffer is None:
            return ""
        return self._render(buffer.lines, query)

    async def follow(
        self, namespace: str, pod: str, container: str, query: LogQuery = LogQuery()
    ) -> AsyncIterator[str]:
        """What `read` returns, then each new line until the container finishes."""
        buffer = self._buffers.setdefault((namespace, pod, container), _Buffer())
        yield self._render(buffer.lines, query)
        sent = len(buffer.lines)
        while True:
            if len(buffer.lines) > sent:
                chunk = buffer.lines[sent:]
                sent = len(buffer.lines)
                yield self._render(chunk, LogQuery(timestamps=query.timestamps))
                continue
            if buffer.finished:
                return
            buffer.changed.clear()
            await buffer.changed.wait()

    @staticmethod
    def _render(lines: list[tuple[dt.datetime, str]], query: LogQuery) -> str:
        selected = lines
        if query.since is not None:
            since = query.since
            selected = [entry for entry in selected if entry[0] >= since]
        if query.tail_lines is not None:
            selected = selected[-query.tail_lines :] if query.tail_lines > 0 else []
        if query.timestamps:
            text = "".join(
                f"{moment.strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z {line}" for moment, line in selected
            )
        else:
            text = "".join(line for _, line in selected)
        if query.limit_bytes is not None:
            text = text.encode()[: query.limit_bytes].decode(errors="ignore")
        return text
