"""The frames a tunnel `Session` exchanges with its peer, independent of how they travel.

The owner of a session carries each `Frame` across its transport (a protobuf message on one
gRPC stream) and hands the frames it receives to `Session.feed` in the order they were sent; the
multiplexer needs nothing else from the transport than that order. Keeping the frame a plain
value (no protobuf here) lets the multiplexer be tested with an in-memory queue and lets the
transport's message change without touching the protocol logic.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_DATA = 128 * 1024
"""The largest DATA payload; writers split bigger writes, a receiver resets a stream sent more.

Small enough that one busy stream's frame does not hold the shared transport for long, big
enough that the per-frame overhead is negligible."""


class FrameKind(StrEnum):
    """What a frame does to its stream; the values equal the names (a proto enum maps 1:1)."""

    OPEN = "OPEN"
    """Opens `stream_id` toward `target`; `credit` is the opener's initial receive window."""
    OPENED = "OPENED"
    """The answer to OPEN: accepted; `credit` is the acceptor's initial receive window."""
    DATA = "DATA"
    """`data` (at most `MAX_DATA` bytes), spending as much of the sender's credit."""
    WINDOW = "WINDOW"
    """Grants the peer `credit` more bytes of DATA, as the application has consumed them."""
    FIN = "FIN"
    """The sender writes no more on this stream (half-close); it may still read."""
    RESET = "RESET"
    """Aborts the stream both ways, with `reason`; as the answer to OPEN it is a refusal."""


@dataclass(frozen=True)
class Frame:
    """One unit on the transport: which stream, what happens to it, and the kind's one field."""

    stream_id: int
    kind: FrameKind
    data: bytes = b""
    """DATA's payload."""
    target: str = ""
    """OPEN's destination: "host:port" or a name the accepting side understands."""
    credit: int = 0
    """WINDOW's grant in bytes; OPEN's and OPENED's initial window."""
    reason: str = ""
    """RESET's reason, for the peer's error messages and logs."""

    def __post_init__(self) -> None:
        # A transport decoding its message may pass the kind's string; normalize (ValueError
        # for an unknown kind) so the session compares enum members only.
        object.__setattr__(self, "kind", FrameKind(self.kind))

    def __repr__(self) -> str:
        # Never the payload: a DATA frame in a log line shows its size.
        parts = [f"{self.kind.value} stream={self.stream_id}"]
        if self.data:
            parts.append(f"data={len(self.data)}B")
        if self.target:
            parts.append(f"target={self.target!r}")
        if self.credit:
            parts.append(f"credit={self.credit}")
        if self.reason:
            parts.append(f"reason={self.reason!r}")
        return f"Frame({' '.join(parts)})"
