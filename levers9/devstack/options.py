"""What `levers9 dev up` and `demo` take (`DevOptions`: the one list the CLI's options and the
stack read), and the `dev` profile `up` writes for the CLI (levers9.profiles)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from levers9.devstack.processes import Progress
from levers9.profiles import (
    DEV_PROFILE,
    Profile,
    ProfileError,
    config_path,
    read_profiles,
    write_profiles,
)


@dataclass(frozen=True)
class DevOptions:
    """What `levers9 dev up` and `demo` take: each field an option of theirs (`--temporal-port`
    for `temporal_port`), in this order, with its help as its annotation's metadata."""

    temporal_port: Annotated[int, "gRPC port of the Temporal dev server"] = 7233
    ui_port: Annotated[int, "port of the Temporal UI"] = 8233
    sandbox_port: Annotated[int, "port of the sandbox's Kubernetes API"] = 6443
    gateway_port: Annotated[int, "port of the gateway the workers dial"] = 7443
    scenario: Annotated[Path | None, "sandbox scenario YAML (default: built-in)"] = None
    ecr_port: Annotated[int, "port of the registry standing in for ECR"] = 5050
    gar_port: Annotated[int, "port of the registry standing in for Artifact Registry"] = 5051
    moto_port: Annotated[int, "port of moto (the controlplane's AWS)"] = 5052
    tunnel: Annotated[
        bool, "the dev pool with tunnel: true and hostNetwork: false (nothing dials it)"
    ] = False
    endpoints_port: Annotated[int, "port of the endpoints' HTTPS front"] = 7480
    fresh: Annotated[
        bool, "the sandbox starts from the scenario, not from the cluster it saved at dev down"
    ] = False


def write_dev_profile(controlplane: str, ca_file: Path, token: str, progress: Progress) -> None:
    """The `dev` profile (`levers9.profiles`): this stack's gateway, its CA and the operator
    token, made current when no other profile is, as kind makes its kubeconfig context."""
    path = config_path()
    try:
        profiles = read_profiles(path)
    except ProfileError as exc:
        progress(f"profile {DEV_PROFILE} not written: {exc}")
        return
    profile = Profile(controlplane=controlplane, tls=True, ca_file=ca_file, token=token)
    current = profiles.current in (None, DEV_PROFILE)
    write_profiles(path, profiles.with_profile(DEV_PROFILE, profile, current=current))
    progress(
        f"profile {DEV_PROFILE} written to {path}"
        + (
            " (current)"
            if current
            else f"; {profiles.current} stays current: levers9 profile use {DEV_PROFILE}"
        )
    )
