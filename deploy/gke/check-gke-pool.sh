#!/usr/bin/env bash
# Check that a GKE GPU pool works: runs the GPU probe on one card and prints what the container
# saw, read from the task record (a slow first start does not hide it).
#
#   deploy/gke/check-gke-pool.sh --gpu RTXPro6000 [--pool gke-rtx6000] [--timeout 15m]
#
# Needs `levers9` on PATH (or LEVERS9=/path/to/levers9) and TEMPORAL_ADDRESS etc. for the
# controlplane's Temporal (`. .levers9/dev/env` on the sandbox).
set -euo pipefail

pool=gke-rtx6000
gpu=""
timeout=15m
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu="$2"; shift 2 ;;
    --pool) pool="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$gpu" ]; then
  echo "--gpu is required, e.g. --gpu RTXPro6000" >&2
  exit 2
fi
exec "${LEVERS9:-levers9}" pool check --pool "$pool" --gpu "$gpu" --timeout "$timeout"
