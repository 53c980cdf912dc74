"""Tunnel frames on the wire: `levers9.tunnel.frames.Frame` <-> `gateway_pb2.TunnelFrame`
(hello/ready are session-level: the gateway and the agent handle them before a Session sees
anything)."""

from __future__ import annotations

from levers9.proto import gateway_pb2
from levers9.tunnel.frames import Frame, FrameKind

WORKER_TARGET = "worker"
"""The tunnel target of the worker's own WorkerService, whatever socket it listens on."""


def to_proto(frame: Frame) -> gateway_pb2.TunnelFrame:
    sid = frame.stream_id
    match frame.kind:
        case FrameKind.OPEN:
            opening = gateway_pb2.TunnelOpen(target=frame.target, credit=frame.credit)
            return gateway_pb2.TunnelFrame(stream_id=sid, open=opening)
        case FrameKind.OPENED:
            opened = gateway_pb2.TunnelOpened(credit=frame.credit)
            return gateway_pb2.TunnelFrame(stream_id=sid, opened=opened)
        case FrameKind.DATA:
            return gateway_pb2.TunnelFrame(stream_id=sid, data=frame.data)
        case FrameKind.WINDOW:
            return gateway_pb2.TunnelFrame(stream_id=sid, window=frame.credit)
        case FrameKind.FIN:
            return gateway_pb2.TunnelFrame(stream_id=sid, fin=gateway_pb2.TunnelFin())
        case FrameKind.RESET:
            return gateway_pb2.TunnelFrame(
                stream_id=sid, reset=gateway_pb2.TunnelReset(reason=frame.reason)
            )
    raise ValueError(f"no frame kind {frame.kind}")


def from_proto(message: gateway_pb2.TunnelFrame) -> Frame:
    """A received frame; hello/ready are session-level and never reach a Session."""
    sid = message.stream_id
    kind = message.WhichOneof("kind")
    if kind == "open":
        return Frame(sid, FrameKind.OPEN, target=message.open.target, credit=message.open.credit)
    if kind == "opened":
        return Frame(sid, FrameKind.OPENED, credit=message.opened.credit)
    if kind == "data":
        return Frame(sid, FrameKind.DATA, data=message.data)
    if kind == "window":
        return Frame(sid, FrameKind.WINDOW, credit=message.window)
    if kind == "fin":
        return Frame(sid, FrameKind.FIN)
    if kind == "reset":
        return Frame(sid, FrameKind.RESET, reason=message.reset.reason)
    # A stray hello/ready (or nothing) mid-session: the stream it names is reset.
    return Frame(sid, FrameKind.RESET, reason=f"unexpected {kind} frame")
