#!/usr/bin/env bash
# Deploys the controlplane to the EKS cluster of the current kubectl context:
#
#   deploy/eks/deploy.sh -f ~/.levers9/gke-pool-values.json [more helm arguments]
#
# It runs `helm upgrade --install` of deploy/helm/levers9-controlplane with
# deploy/eks/values.yaml (your pools, the image, Temporal's address) and passes every extra
# argument on to helm, after it: a private values file (`-f`) holding the service account key
# or the Temporal API key, `--set`, `--dry-run`, `--wait`, ... The chart puts every secret in a
# Secret mounted as a file; nothing here writes a key anywhere.
#
# Environment: LEVERS9_RELEASE (levers9), LEVERS9_NAMESPACE (levers9-system),
# LEVERS9_VALUES (deploy/eks/values.yaml), HELM (helm), KUBECONFIG as kubectl and helm read it.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
release="${LEVERS9_RELEASE:-levers9}"
namespace="${LEVERS9_NAMESPACE:-levers9-system}"
values="${LEVERS9_VALUES:-$here/values.yaml}"
helm="${HELM:-helm}"
say() { echo "deploy: $*" >&2; }

if [ -n "${LEVERS9_GKE_SA_JSON:-}" ]; then
  say "LEVERS9_GKE_SA_JSON is set, and deploy.sh no longer reads it (it wrote the key into a"
  say "values file in the repository). Put the key in a values file of its own instead:"
  say "  umask 077"
  say "  python3 -c 'import json,sys; print(json.dumps({\"config\": {\"worker\": {\"pools\": {\"gke-rtx6000\": {\"kubernetes\": {\"credentials\": open(sys.argv[1]).read()}}}}}}))' \\"
  say "    ~/.levers9/gke-sa.json > ~/.levers9/gke-pool-values.json"
  say "  deploy/eks/deploy.sh -f ~/.levers9/gke-pool-values.json"
  say "then unset LEVERS9_GKE_SA_JSON."
  exit 2
fi
command -v "$helm" >/dev/null 2>&1 || { say "helm not found (HELM=$helm): install helm 3"; exit 2; }
[ -r "$values" ] || { say "cannot read the values file $values (LEVERS9_VALUES)"; exit 2; }

# A values file that carries a key must be readable by its owner only (umask 077).
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  file=""
  case "${args[i]}" in
    -f | --values) file="${args[i + 1]:-}" ;;
    --values=*) file="${args[i]#--values=}" ;;
    -f*) file="${args[i]#-f}" ;;
  esac
  [ -n "$file" ] && [ -f "$file" ] || continue
  mode="$(stat -c '%a' "$file")"
  if [ "${mode: -2}" != "00" ] && grep -q -E '"(credentials|temporalApiKey|workerTokenSecret|apiToken)"|(credentials|temporalApiKey|workerTokenSecret|apiToken):' "$file"; then
    say "$file holds a secret and is readable by others (mode $mode): chmod 600 $file, then deploy again"
    exit 2
  fi
done

context="$(kubectl config current-context 2>/dev/null || echo unknown)"
say "helm upgrade --install $release into namespace $namespace (kubectl context: $context)"
exec "$helm" upgrade --install "$release" "$root/deploy/helm/levers9-controlplane" \
  --namespace "$namespace" --create-namespace \
  -f "$values" "$@"
