"""Host driver libraries: registered with the loader when `/usr/local/nvidia/lib64` exists,
logged with the spec's line verbatim (node paths, not the sandbox's), and the driver's
binaries put on tasks' PATH."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import structlog

from levers9.agent.driver import LOADER_CONF, register_driver_libraries
from levers9.logs import format_line
from tests.agent.kit import sandbox_paths

SPEC_LINE = 'host driver libraries registered with the loader dirs=["/usr/local/nvidia/lib64"]'


def _lines(events: Iterable[MutableMapping[str, Any]]) -> list[str]:
    return [
        format_line(
            str(e["event"]), {k: v for k, v in e.items() if k not in ("event", "log_level")}
        )
        for e in events
    ]


def test_driver_libraries_are_registered_with_the_spec_line(node_root: Path) -> None:
    lib64 = node_root / "usr/local/nvidia/lib64"
    lib64.mkdir(parents=True)
    paths = sandbox_paths(node_root)

    with structlog.testing.capture_logs() as events:
        setup = register_driver_libraries(paths)

    assert _lines(events) == [SPEC_LINE]
    assert setup.registered == ("/usr/local/nvidia/lib64",)
    assert paths.map(LOADER_CONF).read_text() == f"{lib64}\n"
    # The sandbox's loader is the host's: tasks find the libraries through LD_LIBRARY_PATH.
    assert setup.library_path == (lib64,)
    assert setup.bin_dirs == (node_root / "usr/local/nvidia/bin",)


def test_no_driver_no_registration(node_root: Path) -> None:
    with structlog.testing.capture_logs() as events:
        setup = register_driver_libraries(sandbox_paths(node_root))

    assert setup.registered == ()
    assert setup.library_path == ()
    assert SPEC_LINE not in _lines(events)
    assert setup.bin_dirs == (node_root / "usr/local/nvidia/bin",)
