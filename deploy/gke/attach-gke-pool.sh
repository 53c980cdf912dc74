#!/usr/bin/env bash
# The cloud side of a GKE GPU pool, safe to rerun: the service account
# levers9-controlplane@<project> with roles/container.developer, its key (written once to
# ~/.levers9/gke-sa.json, mode 0600, never printed), the Artifact Registry repository
# `levers9`, the worker image copied into it, the firewall rule
# levers9-controlplane-to-<cluster> and the cluster's authorized networks (both only appended
# to, with the controlplane's egress IPs). Ends by printing the pool's values block.
#
#   deploy/gke/attach-gke-pool.sh --project <project> --zone <zone> --cluster <cluster> \
#     --node-pool <node-pool> --gpu RTXPro6000 [--pool-name gke-rtx6000] [--ip <extra egress IP>] \
#     [--tunnel]   # a tunnel-only pool: no firewall rule, the block gets tunnel: true
#     [--enable-authorized-networks]   # a cluster whose API is open to all: turn master
#                  # authorized networks on with our IPs (+ --ip); refused without it
#
# Needs Google credentials (`gcloud auth application-default login`), AWS credentials for the
# controlplane's account (`aws sso login`; the egress IPs and the ECR token come from there),
# `skopeo`, LEVERS9_SOURCE_IMAGE (the worker image in ECR) and the controlplane's Temporal
# (TEMPORAL_ADDRESS ...). On the sandbox: `. .levers9/dev/env` first.
set -euo pipefail

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --project|--zone|--cluster|--node-pool|--gpu|--pool-name|--key-file|--ip)
      [ $# -ge 2 ] || { echo "$1 needs a value (see --help)" >&2; exit 2; }
      args+=("$1" "$2"); shift 2 ;;
    --tunnel|--enable-authorized-networks) args+=("$1"); shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
for required in --project --zone --cluster --node-pool --gpu; do
  case " ${args[*]:-} " in
    *" $required "*) ;;
    *) echo "$required is required (see --help)" >&2; exit 2 ;;
  esac
done
command -v skopeo >/dev/null 2>&1 || { echo "skopeo is required: apt-get install skopeo" >&2; exit 2; }
exec "${LEVERS9:-levers9}" gke attach "${args[@]}"
