"""The `nvidia-smi` queries the agent needs: card indices by UUID, and the cards' names.

The binary ships with the driver in `/usr/local/nvidia/bin` (node path, mapped in the sandbox),
which is not on a container's default PATH; the agent looks there first, then on its PATH.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_TIMEOUT_S = 30.0


class NvidiaSmiError(RuntimeError):
    """`nvidia-smi` failed or said something the agent cannot read."""


@dataclass(frozen=True)
class NvidiaSmi:
    executable: Path

    @classmethod
    def find(cls, bin_dirs: Sequence[Path]) -> NvidiaSmi | None:
        for directory in bin_dirs:
            candidate = directory / "nvidia-smi"
            if candidate.is_file():
                return cls(candidate)
        found = shutil.which("nvidia-smi")
        return cls(Path(found)) if found else None

    async def uuid_indices(self) -> dict[str, int]:
        """GPU UUID → index, from `--query-gpu=index,uuid`."""
        out: dict[str, int] = {}
        for index, uuid in await self._query("index,uuid", 2):
            try:
                out[uuid] = int(index)
            except ValueError:
                raise NvidiaSmiError(f"nvidia-smi printed a non-numeric index {index!r}") from None
        return out

    async def names(self) -> dict[int, str]:
        """Index → product name (`NVIDIA RTX PRO 6000 Blackwell Server Edition`)."""
        out: dict[int, str] = {}
        for index, name in await self._query("index,name", 2):
            if index.isdigit():
                out[int(index)] = name
        return out

    async def _query(self, fields: str, width: int) -> list[list[str]]:
        argv = [str(self.executable), f"--query-gpu={fields}", "--format=csv,noheader"]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            raise NvidiaSmiError(f"{self.executable} could not run: {error}") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), _TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise NvidiaSmiError(f"{' '.join(argv)} timed out after {_TIMEOUT_S:g}s") from None
        if process.returncode != 0:
            detail = (stderr or stdout).decode(errors="replace").strip()
            raise NvidiaSmiError(f"{' '.join(argv)} exited with {process.returncode}: {detail}")
        rows = []
        for line in stdout.decode(errors="replace").splitlines():
            if not line.strip():
                continue
            cells = [c.strip() for c in line.split(",", width - 1)]
            if len(cells) != width:
                raise NvidiaSmiError(f"unexpected nvidia-smi line: {line!r}")
            rows.append(cells)
        return rows
