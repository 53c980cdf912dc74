"""Each runc task's user namespace: the node's ids its container's 0..65535 map to.

A range is a slot: ids `FIRST_ID + slot * RANGE_SIZE` on, `RANGE_SIZE` of them (100000 +
65536 * slot, as Kubernetes gives a pod with `hostUsers: false` one of its own), so a task
that breaks out of its container is an unprivileged user of the node that owns nothing of
another task's. No two running containers of the node share a slot: a slot is an flock(2) on
`<folder>/<slot>.lock`, taken by the agent when it starts the task and handed to the task's
shim, which holds it as long as the container runs. It is freed by the kernel when the shim
and its `runc run` are gone, so a container an agent restarted after it adopts keeps its
range, a new task never gets it, and nothing needs freeing by hand. The folder must be the
node's (the image cache's): every agent of the node claims from the same slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

FIRST_ID = 100_000
RANGE_SIZE = 65_536
SLOTS = (2**32 - FIRST_ID) // RANGE_SIZE - 1
"""What fits below 2^32 (65,534): more than any node runs containers."""


class NoIdRange(RuntimeError):
    """Every slot is held."""


class NamespaceError(RuntimeError):
    """The task's user namespace could not be made; the message says why."""


class IdRange:
    """A task's ids on the node: its container's 0 is the node's `host_id`, held by the lock
    open at `fd` (the shim inherits it) until `release`."""

    def __init__(self, slot: int, fd: int) -> None:
        self.slot = slot
        self.fd = fd
        self._open = True

    @property
    def host_id(self) -> int:
        return FIRST_ID + self.slot * RANGE_SIZE

    @property
    def size(self) -> int:
        return RANGE_SIZE

    def release(self) -> None:
        """Closes the agent's copy of the lock, once (the slot stays held while a shim that
        inherited it runs)."""
        if self._open:
            self._open = False
            with contextlib.suppress(OSError):
                os.close(self.fd)


class IdRanges:
    """The node's slots, as lock files under `folder` (see the module's docstring)."""

    def __init__(self, folder: Path, slots: int = SLOTS) -> None:
        self.folder = folder
        self._slots = slots
        folder.mkdir(parents=True, exist_ok=True)

    def claim(self, taken: frozenset[int] = frozenset()) -> IdRange:
        """The lowest free slot (not locked, not in `taken`), locked; NoIdRange when none is.
        Low slots first: their shifted image roots are the ones most likely cached."""
        for slot in range(self._slots):
            if slot in taken:
                continue
            fd = os.open(self.folder / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return IdRange(slot, fd)
        raise NoIdRange(f"all {self._slots} user-namespace ranges of the node are in use")

    def held(self, slot: int) -> bool:
        """Whether a running container (or an agent starting one) holds `slot`."""
        try:
            fd = os.open(self.folder / f"{slot}.lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def slot_of(host_id: int) -> int:
    return (host_id - FIRST_ID) // RANGE_SIZE


async def make_namespaces(userns: Path, netns: Path, host_id: int, size: int) -> None:
    """A user namespace whose 0..size-1 are the node's host_id.. and a network namespace it
    owns, kept by bind mounts on the files `userns` and `netns` (made here). The container
    joins both: a network namespace the node's root made would be the node's user
    namespace's, which a process in the task's may neither enter (`runc exec` fails:
    `failed to setns into net namespace`) nor mount a sysfs over."""
    for path in (userns, netns):
        path.touch()
    try:
        holder = await asyncio.create_subprocess_exec(
            "unshare",
            "--user",
            "--net",
            "sh",
            "-c",
            "read _",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise NamespaceError("unshare is not installed on this worker") from None
    assert holder.stdin is not None
    try:
        own = os.readlink("/proc/self/ns/user")
        proc = Path(f"/proc/{holder.pid}")
        async with asyncio.timeout(10):
            while os.readlink(proc / "ns" / "user") == own:
                if holder.returncode is not None:
                    _, err = await holder.communicate()
                    raise NamespaceError(f"unshare failed: {err.decode(errors='replace')}")
                await asyncio.sleep(0.001)
        mapping = f"0 {host_id} {size}\n"
        (proc / "uid_map").write_text(mapping)
        (proc / "gid_map").write_text(mapping)
        for kind, path in (("user", userns), ("net", netns)):
            bound = await asyncio.create_subprocess_exec(
                "mount",
                "--bind",
                str(proc / "ns" / kind),
                str(path),
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await bound.communicate()
            if bound.returncode != 0:
                raise NamespaceError(f"mount {kind} namespace: {err.decode(errors='replace')}")
    except (OSError, TimeoutError) as error:
        raise NamespaceError(f"cannot make the task's user namespace: {error}") from None
    finally:
        holder.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        await holder.wait()
