"""A stream multiplexer over one ordered frame channel: the worker tunnel's protocol.

A worker keeps one long-lived bidirectional gRPC stream to the controlplane's gateway; every
connection the controlplane makes toward the worker (gRPC to its WorkerService, TCP to a port of
its containers) travels inside it as a virtual stream. This package is that multiplexing, pure
asyncio and transport-agnostic: the owner of a `Session` carries `Frame`s over whatever ordered
channel it has and feeds the ones it receives back in order.

- `frames`: `Frame`, `FrameKind`, `MAX_DATA`.
- `mux`: `Session` (stream ids, flow control, accept/open) and `Stream` (read/write/half-close).
- `bridge`: `pipe` a stream to a socket, `LocalListener` (loopback TCP -> `Session.open`),
  `dial`/`dial_unix` (an accepted stream -> a TCP or unix socket).

Frames (the initiator of the session opens odd stream ids, the other side even ones, increasing):

    kind    fields          meaning
    ------  --------------  -------------------------------------------------------------------
    OPEN    target, credit  open stream_id toward target; credit = opener's receive window
    OPENED  credit          accepted; credit = acceptor's receive window
    DATA    data            <= MAX_DATA bytes, within the credit the receiver granted
    WINDOW  credit          the receiver's application consumed `credit` bytes: send that many more
    FIN     -               the sender writes no more (half-close); it still reads
    RESET   reason          abort both directions; the answer to OPEN that refuses it

Rules: DATA beyond the granted credit, DATA after FIN, or any frame but RESET before the stream
is accepted resets that stream with "protocol error: ..."; DATA or OPENED for a stream the
receiver does not know is answered with RESET; WINDOW, FIN and RESET for an unknown stream are
dropped (they can legitimately arrive after the stream ended). A stream is forgotten once both
sides sent FIN and its reader drained it, or on RESET.
"""

from levers9.tunnel.bridge import LocalListener, dial, dial_unix, pipe
from levers9.tunnel.frames import MAX_DATA, Frame, FrameKind
from levers9.tunnel.mux import (
    ProtocolError,
    Session,
    Stream,
    StreamRefused,
    StreamReset,
    TunnelError,
)

__all__ = [
    "MAX_DATA",
    "Frame",
    "FrameKind",
    "LocalListener",
    "ProtocolError",
    "Session",
    "Stream",
    "StreamRefused",
    "StreamReset",
    "TunnelError",
    "dial",
    "dial_unix",
    "pipe",
]
