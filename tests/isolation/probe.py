"""What a hostile tenant tries from inside its task: a plain Python script (standard library
only) that the escape suite (tests/isolation/test_escape.py) ships into a real task as
`python3 -c SOURCE CONFIG`, CONFIG being one JSON object the test writes.

It prints one JSON line per probe and nothing else on stdout:

    {"probe": "connect-gateway", "tried": "tcp connect 127.0.0.1:4242", "got": "connected",
     "refused": false}

`refused` is the probe's own verdict (true: the attempt failed or reached nothing of anyone
else's); `tried` and `got` say what it did and what came back, so a failed assertion shows it.

Modes (CONFIG's "mode"):

- `probes`: every probe at once, each in a forked child of its own (a probe that worked, an
  `unshare` say, changes nothing for the next) under a deadline: a TCP connect to each of
  CONFIG's "targets" ({"name", "addresses": ["host:port", ...]}: refused when none accepts),
  a read of each of its "files" ({"name", "paths", "marker"}: refused unless the marker, or
  with none any byte, was read), a search of every visible /proc/*/environ for each of its
  "environs" ({"name", "needle"}), `ptrace` of each of its "pids" ({"name", "pids"}: node
  pids), the kernel's doors (mount, unshare, keyrings, raw sockets, /sys, /proc/sys, bpf,
  perf, modules, ...), and its own limits against the node's ("node": {"memory_bytes",
  "pid_max", "disk_bytes"}: refused when each limit is below the node's own).
- `fork-bomb`: forks until refused; refused when the pids limit stopped it (then it exits 1,
  as a crashed program would). Bombs only under a pids limit no larger than CONFIG's "cap".
- `fill-memory`: allocates and touches memory past its cgroup's limit, only when that limit is
  no larger than CONFIG's "cap" (else it reports the limit and touches nothing); the verdict
  is the task's end (`OOMKilled`): a line saying it was not killed means it was not refused.
- `fill-disk`: fills its root filesystem (fallocate, then writes) until `ENOSPC`, only when
  that filesystem is smaller than the node's ("node_disk_bytes") and than "cap"; then exits 1.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import platform
import re
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import cast

Verdict = tuple[str, str, bool]
"""(tried, got, refused)."""
Config = dict[str, object]

PROBE_SECONDS = 30.0
"""A probe's deadline, generous for a busy machine (gVisor's ptrace platform forks slowly); a
connect waits CONNECT_SECONDS at most, a dropped packet being a refusal, not a hang."""
CONNECT_SECONDS = 3.0

SYSCALLS = {
    # name: (x86_64, aarch64); the few with no glibc wrapper, or whose wrapper hides errno.
    "add_key": (248, 217),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "init_module": (175, 105),
    "unshare": (272, 97),
}
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
SYSLOG_ACTION_READ_ALL = 3
KEY_SPEC_PROCESS_KEYRING = -2
BPF_MAP_CREATE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
MNT_DETACH = 2

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def emit(name: str, tried: str, got: str, refused: bool) -> None:
    line = {"probe": name, "tried": tried, "got": got, "refused": refused}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def syscall(name: str, *args: object) -> tuple[int, int]:
    """(return value, errno) of a raw system call by name."""
    numbers = SYSCALLS[name]
    number = numbers[1] if platform.machine() in ("aarch64", "arm64") else numbers[0]
    ctypes.set_errno(0)
    value = int(libc.syscall(ctypes.c_long(number), *args))
    return value, ctypes.get_errno()


def failed(call: str, code: int) -> str:
    return f"{call}: {errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


# --- the network: nothing but the public internet -------------------------------------------


def connect(address: str) -> tuple[str, bool]:
    """What a TCP connect to `address` (host:port) got, and whether it failed."""
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_SECONDS)
        try:
            sock.connect((host.strip("[]"), int(port)))
        except TimeoutError:
            return f"{address} no answer in {CONNECT_SECONDS:g} s (dropped)", True
        except OSError as error:
            return f"{address} {failed('connect', error.errno or 0)}", True
        return f"{address} connected (from {sock.getsockname()[0]})", False


def connect_all(addresses: list[str]) -> Verdict:
    """Refused when no address accepts a connection (tried at once: a dropped one waits)."""
    with ThreadPoolExecutor(max_workers=len(addresses) or 1) as pool:
        outcomes = list(pool.map(connect, addresses))
    got = "; ".join(text for text, _ in outcomes)
    return f"tcp connect {' '.join(addresses)}", got, all(refused for _, refused in outcomes)


# --- files of others -------------------------------------------------------------------------


def read(path: str, marker: str) -> tuple[str, bool]:
    """What reading `path` got, and whether it failed (or lacked the marker, when given)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError as error:
        return f"{path} {failed('open', error.errno or 0)}", True
    if marker:
        found = marker.encode() in data
        return f"{path} read {len(data)} bytes, marker {'found' if found else 'absent'}", not found
    return f"{path} read {len(data)} bytes", not data


def read_all(paths: list[str], marker: str) -> Verdict:
    outcomes = [read(path, marker) for path in paths]
    tried = f"read {' '.join(paths)}" + (" for the marker" if marker else "")
    return tried, "; ".join(t for t, _ in outcomes), all(refused for _, refused in outcomes)


def proc_environs() -> Iterator[tuple[str, bytes]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    yield entry, handle.read()
            except OSError:
                continue


def environ_search(needle: str) -> Verdict:
    """Any process this task can see whose environment holds `needle`."""
    tried = f"search every /proc/*/environ for {needle!r}"
    seen = [pid for pid, environ in proc_environs() if needle.encode() in environ]
    if seen:
        return tried, f"found in pids {seen}", False
    return tried, f"absent from {len(list(proc_environs()))} visible environments", True


def host_init(host_cmdline: str) -> Verdict:
    """The node's PID 1 (its command line given): /proc/1 must be this task's own."""
    tried = "read /proc/1/environ and /proc/1/cmdline (the node's init?)"
    try:
        with open("/proc/1/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open("/proc/1/environ", "rb") as handle:
            environ = handle.read()
    except OSError as error:
        return tried, failed("open", error.errno or 0), True
    own = b"LEVERS9_TASK_ID=" in environ
    got = f"pid 1 is {cmdline[:60]!r} ({'this task' if own else 'not this task'})"
    return tried, got, own and cmdline != host_cmdline


# --- the kernel's doors ----------------------------------------------------------------------


def text(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def status_line(field: str) -> str:
    lines = text("/proc/self/status").splitlines()
    return next((line for line in lines if line.startswith(f"{field}:")), f"{field}: ?")


def seccomp_mode() -> Verdict:
    line = status_line("Seccomp")
    return "read Seccomp in /proc/self/status", line, line.split()[-1] == "2"


def user_namespace() -> Verdict:
    mapping = " ".join(text("/proc/self/uid_map").split())
    identity = mapping == "0 0 4294967295"
    got = f"uid_map {mapping!r}" + (" (the node's uid 0 itself)" if identity else "")
    return "read /proc/self/uid_map: is uid 0 the node's root?", got, not identity


def mount_tmpfs() -> Verdict:
    target = "/tmp/probe-mount"
    os.makedirs(target, exist_ok=True)
    ctypes.set_errno(0)
    value = libc.mount(b"none", target.encode(), b"tmpfs", 0, None)
    code = ctypes.get_errno()
    if value == 0:
        libc.umount2(target.encode(), MNT_DETACH)  # where it worked, leave nothing mounted
    with _quiet():
        os.rmdir(target)
    if value == 0:
        return "mount a tmpfs", "mounted", False
    return "mount a tmpfs", failed("mount", code), True


def unshare(flag: int, what: str) -> Verdict:
    value, code = syscall("unshare", ctypes.c_int(flag))
    if value == 0:
        return f"unshare({what})", "a new namespace", False
    return f"unshare({what})", failed("unshare", code), True


def ptrace(pid: int) -> tuple[str, bool]:
    ctypes.set_errno(0)
    value = libc.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_int(pid), None, None)
    if value == 0:
        libc.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_int(pid), None, None)
        return f"{pid} attached", False
    return f"{pid} {failed('ptrace', ctypes.get_errno())}", True


def ptrace_all(pids: list[int]) -> Verdict:
    outcomes = [ptrace(pid) for pid in pids]
    tried = f"ptrace(PTRACE_ATTACH) pids {pids} (node pids)"
    return tried, "; ".join(t for t, _ in outcomes), all(refused for _, refused in outcomes)


def keyring() -> Verdict:
    value, code = syscall(
        "add_key", b"user", b"levers9-probe", b"secret", ctypes.c_size_t(6),
        ctypes.c_int(KEY_SPEC_PROCESS_KEYRING),
    )  # fmt: skip
    if value >= 0:
        return "add_key(user) to the kernel keyring", f"key {value}", False
    return "add_key(user) to the kernel keyring", failed("add_key", code), True


def raw_socket() -> Verdict:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    except OSError as error:
        return "socket(AF_INET, SOCK_RAW)", failed("socket", error.errno or 0), True
    return "socket(AF_INET, SOCK_RAW)", "a raw socket", False


NO_DOOR = (errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP)
"""Refused, or a door its kernel does not have (gVisor implements no file handles)."""
DENIED = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT)
"""A write refused by the mount or the permissions, or a file its kernel does not have (gVisor's
/sys and /proc/sys hold few); any other error means it reached the kernel's handler (a value
it disliked), which is not a refusal."""


def write_file(path: str, data: bytes | None = None) -> Verdict:
    """Writes `data`, or what the file holds (its `[chosen]` word for a sysfs choice), back:
    when the write is allowed it changes nothing."""
    tried = f"write {path}"
    try:
        if data is None:
            with open(path, "rb") as handle:
                data = handle.read()
            chosen = re.search(rb"\[(\w+)\]", data)
            data = chosen.group(1) if chosen else data
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as error:
        return tried, failed("write", error.errno or 0), error.errno in DENIED
    return tried, f"wrote {data!r}", False


def own_memory_limit() -> Verdict:
    """Raise its own cgroup memory limit (cgroup v2, else v1)."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        if os.path.exists(path):
            return write_file(path, b"max" if path.endswith(".max") else b"-1")
    return "write its cgroup's memory limit", "no cgroup memory file visible", True


def kcore() -> Verdict:
    return read_all(["/proc/kcore"], "")


def kernel_log() -> Verdict:
    buffer = ctypes.create_string_buffer(4096)
    ctypes.set_errno(0)
    value = libc.klogctl(SYSLOG_ACTION_READ_ALL, buffer, 4096)
    tried = "syslog(READ_ALL): the node's kernel log"
    if value >= 0:
        first = buffer.raw[:value].decode(errors="replace").strip().splitlines()[:1]
        return tried, f"read {value} bytes: {first[0][:80] if first else ''!r}", False
    return tried, failed("syslog", ctypes.get_errno()), True


def load_module() -> Verdict:
    # A null image: refused for want of CAP_SYS_MODULE (EPERM) before the image is read;
    # ENOSYS: a kernel built without modules has no such door.
    value, code = syscall("init_module", None, ctypes.c_ulong(0), b"")
    refused = value != 0 and code in (errno.EPERM, errno.ENOSYS)
    return "init_module (load a kernel module)", failed("init_module", code), refused


def bpf() -> Verdict:
    attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # an array map: key 4 B, value 4 B, 1 entry
    value, code = syscall("bpf", ctypes.c_int(BPF_MAP_CREATE), attr, ctypes.c_uint(128))
    if value >= 0:
        os.close(value)
        return "bpf(BPF_MAP_CREATE)", f"map fd {value}", False
    return "bpf(BPF_MAP_CREATE)", failed("bpf", code), True


def perf_event() -> Verdict:
    attr = (ctypes.c_uint32 * 32)()
    attr[0], attr[1], attr[2] = PERF_TYPE_SOFTWARE, 128, PERF_COUNT_SW_CPU_CLOCK
    value, code = syscall(
        "perf_event_open", attr, ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_int(-1),
        ctypes.c_ulong(0),
    )  # fmt: skip
    tried = "perf_event_open(cpu clock, every process on cpu 0)"
    if value >= 0:
        os.close(value)
        return tried, f"event fd {value}", False
    return tried, failed("perf_event_open", code), True


def open_by_handle() -> Verdict:
    """The "shocker" escape: a file handle forged to name a file outside the container."""
    handle = (ctypes.c_uint32 * 34)(8, 1)  # handle_bytes 8, type 1 (FILEID_INO32_GEN)
    fd = os.open("/", os.O_RDONLY)
    try:
        ctypes.set_errno(0)
        value = libc.open_by_handle_at(ctypes.c_int(fd), handle, ctypes.c_int(os.O_RDONLY))
        code = ctypes.get_errno()
    finally:
        os.close(fd)
    tried = "open_by_handle_at (a forged handle)"
    if value >= 0:
        os.close(value)
        return tried, f"opened fd {value}", False
    return tried, failed("open_by_handle_at", code), code in NO_DOOR


def block_device() -> Verdict:
    """Make the node's first disk's node (8:0) and open it (read-only, then gone)."""
    path = "/tmp/probe-sda"
    try:
        os.mknod(path, 0o600 | 0o060000, os.makedev(8, 0))
        os.close(os.open(path, os.O_RDONLY))
    except OSError as error:
        return "mknod b 8 0 and open it", failed("mknod/open", error.errno or 0), True
    finally:
        with _quiet():
            os.unlink(path)
    return "mknod b 8 0 and open it", "opened the node's disk", False


def set_clock() -> Verdict:
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME))
    except OSError as error:
        return "clock_settime(REALTIME) to now", failed("clock_settime", error.errno or 0), True
    return "clock_settime(REALTIME) to now", "the node's clock set", False


def no_new_privileges() -> Verdict:
    line = status_line("NoNewPrivs")
    return "read NoNewPrivs (setuid binaries gain nothing)", line, line.split()[-1] == "1"


def own_limits(node: dict[str, object]) -> list[tuple[str, Callable[[], Verdict]]]:
    """Its limits by default, each smaller than the node's own (given by the test)."""

    def below(what: str, value: int | None, node_value: int) -> Verdict:
        tried = f"read its {what} limit (the node has {node_value})"
        if value is None:
            return tried, "no limit", False
        return tried, f"limit {value}", value < node_value

    def disk() -> Verdict:
        stat = os.statvfs("/")
        return below("writable layer's", stat.f_blocks * stat.f_frsize, _int(node, "disk_bytes"))

    memory = cgroup_value("memory.max", "memory/memory.limit_in_bytes")
    pids = cgroup_value("pids.max", "pids/pids.max")
    return [
        ("memory-limit", lambda: below("memory", _limit(memory), _int(node, "memory_bytes"))),
        ("pids-limit", lambda: below("pids", _limit(pids), _int(node, "pid_max"))),
        ("disk-limit", disk),
    ]


def _int(mapping: dict[str, object], key: str) -> int:
    return int(str(mapping[key]))


# --- running them ----------------------------------------------------------------------------


def probes(config: Config) -> list[tuple[str, Callable[[], Verdict]]]:
    """Every probe of the `probes` mode, by name."""
    chosen: list[tuple[str, Callable[[], Verdict]]] = []
    for item in _items(config, "targets"):
        addresses = [str(a) for a in _list(item["addresses"])]
        chosen.append((f"connect-{item['name']}", partial(connect_all, addresses)))
    for item in _items(config, "files"):
        paths, marker = [str(p) for p in _list(item["paths"])], str(item.get("marker") or "")
        chosen.append((f"read-{item['name']}", partial(read_all, paths, marker)))
    for item in _items(config, "environs"):
        needle = str(item["needle"])
        chosen.append((f"environ-{item['name']}", partial(environ_search, needle)))
    for item in _items(config, "pids"):
        pids = [int(str(p)) for p in _list(item["pids"])]
        chosen.append((f"ptrace-{item['name']}", partial(ptrace_all, pids)))
    init = str(config.get("host_init_cmdline") or "")
    chosen += [
        ("read-host-init-environ", lambda: host_init(init)),
        ("seccomp-filter", seccomp_mode),
        ("user-namespace", user_namespace),
        ("no-new-privileges", no_new_privileges),
        ("mount", mount_tmpfs),
        ("unshare-user", lambda: unshare(CLONE_NEWUSER, "CLONE_NEWUSER")),
        ("unshare-mount-net", lambda: unshare(CLONE_NEWNS | CLONE_NEWNET, "NEWNS|NEWNET")),
        ("keyctl", keyring),
        ("raw-socket", raw_socket),
        ("write-sys", lambda: write_file("/sys/kernel/mm/transparent_hugepage/enabled")),
        ("write-cgroup-limit", own_memory_limit),
        ("write-core-pattern", lambda: write_file("/proc/sys/kernel/core_pattern")),
        ("read-kcore", kcore),
        ("kernel-log", kernel_log),
        ("load-module", load_module),
        ("bpf", bpf),
        ("perf-event", perf_event),
        ("open-by-handle", open_by_handle),
        ("block-device", block_device),
        ("set-clock", set_clock),
    ]
    node = config.get("node")
    if isinstance(node, dict):
        chosen += own_limits(cast(dict[str, object], node))
    return chosen


def _list(value: object) -> list[object]:
    assert isinstance(value, list), value
    return value


def _items(config: Config, key: str) -> list[dict[str, object]]:
    items = _list(config.get(key) or [])
    assert all(isinstance(item, dict) for item in items), items
    return [cast(dict[str, object], item) for item in items]


def run_probes(config: Config) -> None:
    """Each probe in a child of its own, all at once; each answers on a pipe by its deadline."""
    children: dict[int, tuple[str, int]] = {}
    for name, probe in probes(config):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                tried, got, refused = probe()
                answer = json.dumps([tried, got, refused])
            except Exception as error:  # a probe that broke says how
                answer = json.dumps([name, f"probe error {error!r}", False])
            os.write(write_end, answer.encode())
            os._exit(0)
        os.close(write_end)
        children[read_end] = (name, pid)
    answers: dict[int, bytes] = {fd: b"" for fd in children}
    deadline = time.monotonic() + PROBE_SECONDS
    open_fds = set(children)
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], deadline - time.monotonic())
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                answers[fd] += chunk
            else:
                open_fds.discard(fd)
    for fd, (name, pid) in children.items():
        try:
            tried, got, refused = json.loads(answers[fd])
        except ValueError:
            tried, got, refused = name, f"no answer in {PROBE_SECONDS:g} s", False
        emit(name, str(tried), str(got), bool(refused))
        os.close(fd)
        with _quiet():
            os.kill(pid, signal.SIGKILL)
        with _quiet():
            os.waitpid(pid, 0)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


# --- the destructive ones, each in a task of its own ----------------------------------------


def cgroup_value(v2: str, v1: str) -> str:
    for path in (f"/sys/fs/cgroup/{v2}", f"/sys/fs/cgroup/{v1}"):
        try:
            return text(path).strip()
        except OSError:
            continue
    return "max"


def _limit(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) < 1 << 60 else None


def fork_bomb(config: Config) -> int:
    cap = int(str(config["cap"]))
    limit = _limit(cgroup_value("pids.max", "pids/pids.max"))
    tried = f"fork until refused (pids limit {limit})"
    if limit is None or limit > cap:
        emit("fork-bomb", tried, f"no pids limit at or under {cap}: not bombed", False)
        return 0
    children = 0
    try:
        while children <= limit:
            pid = os.fork()
            if pid == 0:
                signal.pause()
                os._exit(0)
            children += 1
    except OSError as error:
        emit("fork-bomb", tried, failed(f"fork #{children + 1}", error.errno or 0), True)
        return 1
    emit("fork-bomb", tried, f"{children} children past the limit", False)
    return 0


def fill_memory(config: Config) -> int:
    cap = int(str(config["cap"]))
    limit = _limit(cgroup_value("memory.max", "memory/memory.limit_in_bytes"))
    tried = f"allocate past the memory limit ({limit} bytes)"
    if limit is None or limit > cap:
        emit("fill-memory", tried, f"no memory limit at or under {cap}: not filled", False)
        return 0
    emit("fill-memory", tried, "allocating (refused if the kernel kills this task)", True)
    held: list[bytearray] = []
    chunk = 16 << 20
    while len(held) * chunk < 2 * limit:
        held.append(bytearray(b"\1" * chunk))
    emit("fill-memory", tried, f"held {len(held) * chunk} bytes: not killed", False)
    return 0


def fill_disk(config: Config) -> int:
    """Fills / by allocating (fallocate: no data written, so a cap of gigabytes fills at
    once), then by writing, until ENOSPC; only where / is a filesystem of its own smaller than
    the node's and than the cap."""
    cap, node = int(str(config["cap"])), int(str(config["node_disk_bytes"]))
    stat = os.statvfs("/")
    size = stat.f_blocks * stat.f_frsize
    tried = f"fill / until it is full (its size {size} bytes)"
    if size > cap or size >= node:
        emit("fill-disk", tried, f"/ is the node's disk or over {cap} bytes: not filled", False)
        return 0
    allocated, chunk = 0, 256 << 20
    fd = os.open("/probe-fill", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while chunk >= 4096:
            try:
                os.posix_fallocate(fd, allocated, chunk)
                allocated += chunk
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                chunk //= 16
        os.lseek(fd, allocated, os.SEEK_SET)
        while allocated <= size:
            allocated += os.write(fd, b"\1" * 4096)
            os.fsync(fd)
    except OSError as error:
        emit("fill-disk", tried, failed(f"after {allocated} bytes", error.errno or 0), True)
        return 1
    finally:
        os.close(fd)
    emit("fill-disk", tried, f"wrote {allocated} bytes: never full", False)
    return 0


def main(argv: list[str]) -> int:
    config: Config = json.loads(argv[1])
    mode = config.get("mode", "probes")
    if mode == "probes":
        run_probes(config)
        return 0
    destructive = {"fork-bomb": fork_bomb, "fill-memory": fill_memory, "fill-disk": fill_disk}
    return destructive[str(mode)](config)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
