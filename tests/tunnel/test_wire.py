"""Every frame kind crosses the protobuf wire with every field it carries (a lost `credit` on
OPEN/OPENED once left both sides with a zero window: nothing flowed)."""

from __future__ import annotations

import pytest

from levers9.proto import gateway_pb2
from levers9.tunnel.frames import Frame, FrameKind
from levers9.tunnel.wire import from_proto, to_proto

FRAMES = [
    Frame(1, FrameKind.OPEN, target="worker", credit=262144),
    Frame(1, FrameKind.OPENED, credit=131072),
    Frame(3, FrameKind.DATA, data=b"\x00bytes\xff"),
    Frame(3, FrameKind.WINDOW, credit=65536),
    Frame(4, FrameKind.FIN),
    Frame(5, FrameKind.RESET, reason="target db is not this worker"),
]


@pytest.mark.parametrize("frame", FRAMES, ids=[f.kind.value for f in FRAMES])
def test_frames_round_trip(frame: Frame) -> None:
    wire = to_proto(frame).SerializeToString()
    assert from_proto(gateway_pb2.TunnelFrame.FromString(wire)) == frame


def test_a_session_frame_mid_session_resets_its_stream() -> None:
    hello = gateway_pb2.TunnelFrame(stream_id=7, hello=gateway_pb2.TunnelHello(worker_id="w"))
    assert from_proto(hello) == Frame(7, FrameKind.RESET, reason="unexpected hello frame")
