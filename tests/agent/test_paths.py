"""Node paths and where they are: themselves on a node; in the sandbox, the mount with the
longest matching mountPath, else under the node root. The variable names are the sandbox
kubelet's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers9.agent import paths as worker_paths
from levers9.agent.paths import HostPaths, HostPathsError
from sandbox.cluster import podenv


def test_the_contract_is_the_sandbox_kubelets() -> None:
    assert (worker_paths.ROOT_ENV, worker_paths.MOUNTS_ENV) == (podenv.ROOT_ENV, podenv.MOUNTS_ENV)


def test_on_a_node_paths_are_themselves() -> None:
    paths = HostPaths.from_env({})
    assert not paths.sandboxed
    assert paths.map("/usr/local/nvidia/lib64") == Path("/usr/local/nvidia/lib64")


def test_in_the_sandbox_mounts_win_then_the_root(tmp_path: Path) -> None:
    env = {
        worker_paths.ROOT_ENV: str(tmp_path / "node"),
        worker_paths.MOUNTS_ENV: json.dumps(
            {"/var/lib/kubelet/device-plugins": "/m/dp", "/var/lib": "/m/lib"}
        ),
    }
    paths = HostPaths.from_env(env)

    assert paths.sandboxed
    assert paths.map("/var/lib/kubelet/device-plugins/x") == Path("/m/dp/x")
    assert paths.map("/var/lib/kubelet/device-plugins") == Path("/m/dp")
    assert paths.map("/var/lib/levers9") == Path("/m/lib/levers9")
    assert paths.map("/var/libx") == tmp_path / "node/var/libx"
    assert paths.map("/usr/local/nvidia/../nvidia/bin") == tmp_path / "node/usr/local/nvidia/bin"


@pytest.mark.parametrize("raw", ["{oops", "[]"])
def test_bad_mounts_are_an_error(raw: str) -> None:
    with pytest.raises(HostPathsError, match=worker_paths.MOUNTS_ENV):
        HostPaths.from_env({worker_paths.MOUNTS_ENV: raw})
