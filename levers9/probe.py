"""`levers9-probe`: the GPU check's task. Reports only what the container saw: `nvidia-smi`'s
answer (null when there is none), whether CUDA works in torch, the device it names, and whether a
real matmul on it agrees with the CPU. It never invents a device.

It writes its result to `$LEVERS9_RESULT_PATH` (the worker keeps it in the task record) and
prints it. Exit 0 when it could look, whatever it found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

SMI_TIMEOUT_S = 30
MATMUL_SIZE = 512


def nvidia_smi() -> str | None:
    """`<name>, <memory>` of the first card, as the spec's check prints it; None without one."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    done = subprocess.run(
        [binary, "--query-gpu=name,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=SMI_TIMEOUT_S,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def cuda() -> dict[str, Any]:
    """CUDA through torch, with a real matmul checked against the CPU."""
    try:
        import torch
    except ImportError:
        return {"cuda": False, "device": None, "matmul_ok": None}
    if not torch.cuda.is_available():
        return {"cuda": False, "device": None, "matmul_ok": None}
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    on_gpu = (a.cuda() @ b.cuda()).cpu()
    ok = bool(torch.allclose(on_gpu, a @ b, rtol=1e-3, atol=1e-3))
    return {"cuda": True, "device": torch.cuda.get_device_name(0), "matmul_ok": ok}


def probe() -> dict[str, Any]:
    return {"nvidia_smi": nvidia_smi(), **cuda()}


def main() -> None:
    result = probe()
    text = json.dumps(result)
    path = os.environ.get("LEVERS9_RESULT_PATH")
    if path:
        with open(path, "w") as out:
            out.write(text)
    print(text)
    sys.exit(0)


if __name__ == "__main__":
    main()
