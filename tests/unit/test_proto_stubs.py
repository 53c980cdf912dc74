"""The checked-in gRPC stubs match the .proto sources: regenerate with
`python -m levers9.proto.generate` after changing a .proto (the README says so).
"""

from __future__ import annotations

from pathlib import Path

from levers9.proto.generate import generate

PROTO_DIR = Path(__file__).parents[2] / "levers9" / "proto"


def test_checked_in_stubs_are_fresh(tmp_path: Path) -> None:
    generated = generate(out=tmp_path)
    assert {p.name for p in generated} == {p.name for p in PROTO_DIR.glob("*_pb2*.py*")}
    for fresh in generated:
        checked_in = PROTO_DIR / fresh.name
        assert fresh.read_text() == checked_in.read_text(), (
            f"{checked_in} is stale: run python -m levers9.proto.generate"
        )
