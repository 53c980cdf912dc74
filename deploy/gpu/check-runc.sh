#!/usr/bin/env bash
# The GPU check on this host, in a runc container with the host's NVIDIA driver and devices,
# without a cluster (deploy/gpu/check_runc.py says how):
#
#   sudo deploy/gpu/check-runc.sh [--gpus 1] [--layout DIR:TAG] [--simulated-gpus]
#
# Runs from a checkout with `make` done once (its .venv), or any Python with levers9-pools[dev].
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
"$root/deploy/dev/install-tools.sh"
cd "$root"
exec "$python" -P deploy/gpu/check_runc.py "$@"
