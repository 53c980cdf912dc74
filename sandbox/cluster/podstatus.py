"""A pod's phase and conditions from its container statuses, as the kubelet derives them
(`getPhase` and the condition generators in `pkg/kubelet/status`) (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandbox.cluster.objects import set_condition

Status = Mapping[str, Any]


def _find(statuses: Sequence[Status], name: str) -> Status | None:
    return next((s for s in statuses if s.get("name") == name), None)


def _last_failed(status: Status) -> bool:
    last = (status.get("lastState") or {}).get("terminated")
    return last is not None and last.get("exitCode", 0) != 0


def phase(
    spec: Mapping[str, Any],
    init_statuses: Sequence[Status],
    statuses: Sequence[Status],
    *,
    terminal: bool = False,
) -> str:
    """`getPhase`: `terminal` is true once the kubelet has stopped the pod for good (deleted,
    or every container done under its restart policy)."""
    policy = spec.get("restartPolicy") or "Always"
    pending_init = failed_init = 0
    for container in spec.get("initContainers") or ():
        status = _find(init_statuses, str(container.get("name")))
        state = (status or {}).get("state") or {}
        if status is None or "running" in state:
            pending_init += 1
        elif "terminated" in state:
            failed_init += state["terminated"].get("exitCode", 0) != 0
        elif "waiting" in state and _last_failed(status):
            failed_init += 1
        else:
            pending_init += 1
    unknown = running = waiting = stopped = succeeded = 0
    for container in spec.get("containers") or ():
        status = _find(statuses, str(container.get("name")))
        state = (status or {}).get("state") or {}
        if status is None:
            unknown += 1
        elif "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"].get("exitCode", 0) == 0
        elif "waiting" in state:
            if (status.get("lastState") or {}).get("terminated") is not None:
                stopped += 1
            else:
                waiting += 1
        else:
            unknown += 1
    if failed_init and policy == "Never":
        return "Failed"
    if (pending_init and not running and not stopped) or waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    count = len(spec.get("containers") or ())
    if stopped == count and not unknown:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if policy == "Never" else "Running"
    return "Pending"


def conditions(
    existing: Sequence[Mapping[str, Any]],
    spec: Mapping[str, Any],
    init_statuses: Sequence[Status],
    statuses: Sequence[Status],
    pod_phase: str,
    sandbox_ready: bool,
    now: str,
) -> list[dict[str, Any]]:
    """The kubelet's conditions in its order, keeping those other components own
    (PodScheduled, DisruptionTarget, readiness gates)."""
    kept = [dict(c) for c in existing]
    names = [str(c.get("name")) for c in spec.get("initContainers") or ()]
    incomplete = [
        n
        for n in names
        if "terminated" not in ((_find(init_statuses, n) or {}).get("state") or {})
        or ((_find(init_statuses, n) or {}).get("state") or {})["terminated"].get("exitCode", 0)
    ]
    unready = [
        str(c.get("name"))
        for c in spec.get("containers") or ()
        if not (_find(statuses, str(c.get("name"))) or {}).get("ready")
    ]
    completed = pod_phase == "Succeeded"
    set_condition(kept, "PodReadyToStartContainers", "True" if sandbox_ready else "False", now)
    if not incomplete:
        set_condition(
            kept, "Initialized", "True", now, reason="PodCompleted" if completed else None
        )
    else:
        set_condition(
            kept,
            "Initialized",
            "False",
            now,
            reason="ContainersNotInitialized",
            message=f"containers with incomplete status: [{' '.join(incomplete)}]",
        )
    for kind in ("Ready", "ContainersReady"):
        if not unready and pod_phase == "Running":
            set_condition(kept, kind, "True", now)
        elif completed:
            set_condition(kept, kind, "False", now, reason="PodCompleted")
        else:
            set_condition(
                kept,
                kind,
                "False",
                now,
                reason="ContainersNotReady",
                message=f"containers with unready status: [{' '.join(unready)}]",
            )
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
    return sorted(kept, key=lambda c: order.index(c["type"]) if c["type"] in order else 99)


def pod_status(
    existing: Mapping[str, Any],
    spec: Mapping[str, Any],
    init: Sequence[Status],
    main: Sequence[Status],
    *,
    terminal: bool,
    host_ip: str,
    pod_ip: str | None,
    start_time: str | None,
    now: str,
) -> dict[str, Any]:
    """The whole `status` a kubelet writes, in the order it serializes the fields."""
    pod_phase = phase(spec, init, main, terminal=terminal)
    status: dict[str, Any] = {
        "phase": pod_phase,
        "conditions": conditions(
            existing.get("conditions") or [], spec, init, main, pod_phase, not terminal, now
        ),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
    }
    if pod_ip:
        status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
    if start_time:
        status["startTime"] = start_time
    if init:
        status["initContainerStatuses"] = [dict(s) for s in init]
    status["containerStatuses"] = [dict(s) for s in main]
    status["qosClass"] = existing.get("qosClass", "BestEffort")
    return status
