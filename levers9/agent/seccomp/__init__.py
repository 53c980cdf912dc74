"""The tasks' seccomp filter: a profile in the Docker format (`default.json` here, moby's
default: see README.md beside it; or the pool's `taskSeccompProfile`), turned into runc's
`linux.seccomp` for the node's architecture and the capabilities the task holds.

The conversion is Docker's: the native architecture and its sub-architectures from `archMap`;
each rule kept only when its `includes` hold (architectures, every capability, a minimum
kernel) and its `excludes` do not (architectures, any capability). With runc's default
capabilities a task gets `mount`, `unshare`, `setns`, `bpf`, `keyctl`, `clone` with a
namespace flag, ... refused (EPERM).
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = Path(__file__).with_name("default.json")
ACTIONS = frozenset(
    {
        "SCMP_ACT_KILL",
        "SCMP_ACT_KILL_PROCESS",
        "SCMP_ACT_KILL_THREAD",
        "SCMP_ACT_TRAP",
        "SCMP_ACT_ERRNO",
        "SCMP_ACT_TRACE",
        "SCMP_ACT_ALLOW",
        "SCMP_ACT_LOG",
    }
)
OPERATORS = frozenset(
    {
        "SCMP_CMP_NE",
        "SCMP_CMP_LT",
        "SCMP_CMP_LE",
        "SCMP_CMP_EQ",
        "SCMP_CMP_GE",
        "SCMP_CMP_GT",
        "SCMP_CMP_MASKED_EQ",
    }
)
_ARCHES = {
    # uname -m: (libseccomp's name, Go's name as the profiles' `includes.arches` spell it)
    "x86_64": ("SCMP_ARCH_X86_64", "amd64"),
    "aarch64": ("SCMP_ARCH_AARCH64", "arm64"),
    "ppc64le": ("SCMP_ARCH_PPC64LE", "ppc64le"),
    "s390x": ("SCMP_ARCH_S390X", "s390x"),
}


class SeccompProfileError(ValueError):
    """The profile file is not one runc can apply; the message names the file and the field."""


def load_profile(path: Path) -> dict[str, Any]:
    """The profile at `path`, checked (SeccompProfileError naming what is wrong)."""
    try:
        profile = json.loads(path.read_text())
    except OSError as error:
        raise SeccompProfileError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise SeccompProfileError(f"{path} is not JSON: {error}") from None
    problem = profile_problem(profile)
    if problem is not None:
        raise SeccompProfileError(f"{path}: {problem}")
    return dict(profile)


def profile_problem(profile: object) -> str | None:
    """What makes `profile` unusable (the field named), None when it is a profile."""
    if not isinstance(profile, dict):
        return "not a JSON object with defaultAction and syscalls"
    if profile.get("defaultAction") not in ACTIONS:
        return f"defaultAction: {profile.get('defaultAction')!r} is none of {sorted(ACTIONS)}"
    rules = profile.get("syscalls")
    if not isinstance(rules, list):
        return "syscalls: missing or not a list"
    for i, rule in enumerate(rules):
        where = f"syscalls[{i}]"
        if not isinstance(rule, dict):
            return f"{where}: not an object"
        names = rule.get("names") or ([rule["name"]] if rule.get("name") else None)
        if not names or not all(isinstance(n, str) and n for n in names):
            return f"{where}.names: missing or not a list of syscall names"
        if rule.get("action") not in ACTIONS:
            return f"{where}.action: {rule.get('action')!r} is none of {sorted(ACTIONS)}"
        for j, arg in enumerate(rule.get("args") or ()):
            if not isinstance(arg, dict) or arg.get("op") not in OPERATORS:
                return f"{where}.args[{j}].op: none of {sorted(OPERATORS)}"
            if not all(isinstance(arg.get(k, 0), int) for k in ("index", "value", "valueTwo")):
                return f"{where}.args[{j}]: index, value and valueTwo must be integers"
    return None


def oci_seccomp(
    profile: Mapping[str, Any],
    capabilities: Collection[str],
    *,
    machine: str | None = None,
    kernel: str | None = None,
) -> dict[str, Any]:
    """runc's `linux.seccomp` from `profile` for a process holding `capabilities` (bounding
    set), on `machine` (uname -m) and `kernel` (uname -r): the node's by default."""
    machine = machine or platform.machine()
    release = _version(kernel or platform.release())
    native, go_arch = _ARCHES.get(machine, (f"SCMP_ARCH_{machine.upper()}", machine))
    architectures = list(profile.get("architectures") or [])
    for entry in profile.get("archMap") or ():
        if entry.get("architecture") == native:
            architectures = [native, *(entry.get("subArchitectures") or ())]
    held = set(capabilities)
    syscalls = []
    for rule in profile.get("syscalls") or ():
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("arches") and go_arch not in includes["arches"]:
            continue
        if go_arch in (excludes.get("arches") or ()):
            continue
        if not held.issuperset(includes.get("caps") or ()):
            continue
        if held.intersection(excludes.get("caps") or ()):
            continue
        if includes.get("minKernel") and release < _version(includes["minKernel"]):
            continue
        syscall: dict[str, Any] = {
            "names": list(rule.get("names") or [rule["name"]]),
            "action": rule["action"],
        }
        if rule.get("errnoRet") is not None:
            syscall["errnoRet"] = int(rule["errnoRet"])
        if rule.get("args"):
            syscall["args"] = [
                {
                    "index": int(a.get("index", 0)),
                    "value": int(a.get("value", 0)),
                    "valueTwo": int(a.get("valueTwo", 0)),
                    "op": a["op"],
                }
                for a in rule["args"]
            ]
        syscalls.append(syscall)
    seccomp: dict[str, Any] = {
        "defaultAction": profile["defaultAction"],
        "architectures": architectures,
        "syscalls": syscalls,
    }
    if profile.get("defaultErrnoRet") is not None:
        seccomp["defaultErrnoRet"] = int(profile["defaultErrnoRet"])
    return seccomp


def _version(text: str) -> tuple[int, ...]:
    """`6.18.44-fc` as (6, 18, 44)."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split("-", 1)[0])[:3])
