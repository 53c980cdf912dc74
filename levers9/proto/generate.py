"""Regenerates the gRPC stubs: `python -m levers9.proto.generate` (a test fails when they are
stale). The .proto sources (package `levers9.v1`) live here; the stubs land beside them, typed
by mypy-protobuf, and import each other as `levers9.proto.<name>_pb2`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).parent
ROOT = HERE.parent.parent  # the repository root: generated imports are package-absolute
BIN = Path(sys.executable).parent  # mypy-protobuf's plugins


def generate(out: Path = ROOT) -> list[Path]:
    sources = sorted(str(p.relative_to(ROOT)) for p in HERE.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *sources,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with {code}")
    return sorted((out / "levers9" / "proto").glob("*_pb2*.py*"))


if __name__ == "__main__":
    for path in generate():
        print(path, file=sys.stderr)
