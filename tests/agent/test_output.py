"""Task output and back-off: bounded memory (the tail), offsets, followers that end with the
task; retry delays that grow, jitter, and stay under their ceiling."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from levers9.agent.backoff import Backoff
from levers9.agent.output import TaskOutput


def test_only_the_tail_stays_in_memory(tmp_path: Path) -> None:
    output = TaskOutput(tmp_path / "out.log", tail_bytes=4)
    output.write(b"abc")
    output.write(b"defg")

    assert output.tail() == "defg"
    assert output.read(0) == b"abcdefg"
    assert output.read(5) == b"fg"
    assert output.read(99) == b""


async def test_followers_see_every_write_then_the_end(tmp_path: Path) -> None:
    output = TaskOutput(tmp_path / "out.log")

    async def follow() -> list[tuple[int, bytes]]:
        return [chunk async for chunk in output.chunks(0, follow=True)]

    follower = asyncio.create_task(follow())
    for piece in (b"one ", b"two "):
        await asyncio.sleep(0.01)
        output.write(piece)
    output.close()

    chunks = await asyncio.wait_for(follower, 5)
    assert b"".join(data for _, data in chunks) == b"one two "
    assert chunks[0][0] == 0


def test_backoff_grows_with_jitter_under_its_ceiling() -> None:
    backoff = Backoff(first_s=1, ceiling_s=8)
    rng = random.Random(7)
    delays = [backoff.delay(attempt, rng) for attempt in range(8)]

    assert 0.5 <= delays[0] <= 1
    assert 2 <= delays[2] <= 4
    assert all(4 <= d <= 8 for d in delays[3:])
    assert len(set(delays[3:])) > 1
