"""The CDI spec's edits for a container (pure): each asked card's device node, then the common
control devices and the driver's mount; a card the spec does not hold is refused as CDI
runtimes refuse it; a task with no card gets nothing of the driver. Generating from a real
/dev needs mknod: tests/agent/test_runc_runtime.py."""

from __future__ import annotations

import pytest

from levers9.agent.cdi import DeviceNode, UnresolvableDevices, edits

SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": str(i),
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": f"/dev/nvidia{i}",
                        "hostPath": f"/node/dev/nvidia{i}",
                        "type": "c",
                        "major": 195,
                        "minor": i,
                    }
                ]
            },
        }
        for i in (0, 1, 2)
    ],
    "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
        "mounts": [{"hostPath": "/node/nvidia", "containerPath": "/usr/local/nvidia"}],
    },
}


def test_the_asked_cards_and_the_common_edits() -> None:
    got = edits(SPEC, (2, 0))
    assert got.device_nodes == (
        DeviceNode("/dev/nvidia0", "/node/dev/nvidia0", 195, 0),
        DeviceNode("/dev/nvidia2", "/node/dev/nvidia2", 195, 2),
        DeviceNode("/dev/nvidiactl", "/dev/nvidiactl", 195, 255),
    )
    assert got.mounts == (("/node/nvidia", "/usr/local/nvidia"),)


def test_no_card_no_driver_and_an_unknown_card_is_refused() -> None:
    assert edits(SPEC, ()).device_nodes == ()
    assert edits(SPEC, ()).mounts == ()
    with pytest.raises(UnresolvableDevices, match=r"^unresolvable CDI devices nvidia.com/gpu=3, "):
        edits(SPEC, (1, 3, 4))
