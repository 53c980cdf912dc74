"""A task's captured output: everything spilled to a file, the tail kept in memory.

Memory stays bounded however much a task prints: bytes go to `output.log` in the task's
directory as they come, and only the last `tail_bytes` stay in memory for the status's
`log_tail`. Readers address the output by byte offset (StreamLogs resumes where it left
off); followers wait for the next write or for the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

CHUNK_BYTES = 64 * 1024
TAIL_BYTES = 8 * 1024


class TaskOutput:
    """Append-only output of one task (see module doc)."""

    def __init__(self, path: Path, tail_bytes: int = TAIL_BYTES, *, resume: bool = False) -> None:
        """`resume`: carries on the file an agent before this one wrote (its bytes kept, the
        tail read back from it); else starts it empty."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file = path.open("ab" if resume else "wb")
        self._size = self._file.tell()
        self._tail = bytearray()
        if self._size:
            with path.open("rb") as reader:
                reader.seek(max(self._size - tail_bytes, 0))
                self._tail += reader.read(tail_bytes)
        self._tail_bytes = tail_bytes
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def size(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self._file.write(data)
        # Flushed at once: followers read the file, not this buffer.
        self._file.flush()
        self._size += len(data)
        self._tail += data
        if len(self._tail) > self._tail_bytes:
            del self._tail[: len(self._tail) - self._tail_bytes]
        self._wake()

    def close(self) -> None:
        """No more output: followers finish once they have read everything."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        self._wake()

    def tail(self) -> str:
        # A cut through a multi-byte character at the start is replaced, not an error.
        return self._tail.decode(errors="replace")

    def read(self, offset: int, limit: int = CHUNK_BYTES) -> bytes:
        """Up to `limit` bytes from `offset` (nothing past the end)."""
        if offset >= self._size:
            return b""
        with self._path.open("rb") as reader:
            reader.seek(max(offset, 0))
            return reader.read(min(limit, self._size - max(offset, 0)))

    async def chunks(self, offset: int, follow: bool) -> AsyncIterator[tuple[int, bytes]]:
        """(offset, data) from `offset` to the current end, or, following, to the close."""
        position = max(offset, 0)
        while True:
            changed = self._changed
            data = self.read(position)
            if data:
                yield position, data
                position += len(data)
                continue
            if not follow or self._closed:
                return
            await changed.wait()

    def _wake(self) -> None:
        # A fresh event per change: every waiter of the old one wakes exactly once.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
