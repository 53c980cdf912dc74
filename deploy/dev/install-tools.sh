#!/usr/bin/env bash
# The Debian packages the sandbox and the worker's image cache run on, installed when missing:
#   docker-registry  the CNCF distribution registry: `levers9 dev up` runs two of them on
#                    127.0.0.1 as the controlplane's ECR and the project's Artifact Registry
#   skopeo           copies images between them, as the attach script copies the worker image,
#                    and pulls tasks' images into a worker's cache (levers9/agent/images.py)
#   umoci            unpacks a cached image into a root filesystem; builds the tests' images
#   runc             runs a task's container (the worker's runc runtime; its tests need root)
#   busybox-static   the one static binary of the tests' smallest image
#   mmdebstrap       builds the Python image (a Debian root filesystem) of the demo and the
#                    benchmarks, once per machine (sandbox/task_images.py caches it), and the
#                    stand-in for python:*-slim that deploy/images/*.Dockerfile build on
#   buildah          builds deploy/images/*.Dockerfile in the tests (chroot isolation, no
#                    daemon: tests/deploy/test_dockerfiles.py)
#   slirp4netns      a task's outbound network: user-mode NAT into the task's own network
#                    namespace (levers9/worker: task isolation)
#   nftables         the rules inside a task's namespace that keep it off the node, link-local,
#                    private ranges and other tasks
#   runsc            gVisor, a pool's `runtime: runsc` (a user-space kernel per task): the dev
#                    pool offers it (levers9/devstack/values.py RUNTIMES: `--runtime runsc`)
#   rclone, fuse3    a task's workspace volume: its bucket FUSE-mounted (levers9/agent/volumes.py)
#   s3fs             the other FUSE backend of volumes (benchmarks/storage.py measures both)
# Idempotent: with all present it does nothing and needs no root. Without them it needs root
# (or passwordless sudo) for apt-get; otherwise it names the packages and fails.
set -euo pipefail

missing=()
command -v docker-registry >/dev/null 2>&1 || [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nftables)
command -v runsc >/dev/null 2>&1 || [ -x /usr/bin/runsc ] || missing+=(runsc)
command -v rclone >/dev/null 2>&1 || missing+=(rclone)
command -v s3fs >/dev/null 2>&1 || missing+=(s3fs)
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
[ ${#missing[@]} -eq 0 ] && exit 0

say() { echo "install-tools: $*" >&2; }
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  say "missing ${missing[*]}; install as root: apt-get install -y ${missing[*]}"
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "missing ${missing[*]} and no apt-get here; install the package(s) ${missing[*]} by hand"
  exit 1
fi

say "installing ${missing[*]} (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq >&2 || say "apt-get update failed; trying the install anyway"
for package in "${missing[@]}"; do
  if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends "$package" >&2; then
    say "could not install the Debian package '$package' (apt-get install -y $package)"
    exit 1
  fi
done
