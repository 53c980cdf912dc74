# The levers9 worker image: the `levers9-worker` agent that runs on a GPU node as one privileged
# Job per machine (levers9/core/manifests.py), and the tasks it runs as its child processes.
#
# Build from the repository root; the context is the repository, filtered by /.dockerignore:
#   docker build -f deploy/images/worker.Dockerfile -t levers9/worker:latest .
#
# No CUDA userspace here: the node's NVIDIA driver is mounted from the host at
# /usr/local/nvidia (GKE's device plugin). At start the agent registers /usr/local/nvidia/lib64
# with the loader (an ld.so.conf.d entry and ldconfig: levers9/agent/driver.py) and finds
# nvidia-smi in /usr/local/nvidia/bin; the ENV below puts both where a shell in the container
# looks too.
#
# NVIDIA_VISIBLE_DEVICES is deliberately not set: the agent reads its cards from the kubelet's
# device-plugin checkpoint and sets NVIDIA_VISIBLE_DEVICES per task; an image default (CUDA
# images say `all`) would hand every card of the node to the container's runtime.
#
# The worker runs as root in a privileged container (the Job sets securityContext.privileged):
# ldconfig and the loader configuration need root, and the agent reads the kubelet's
# checkpoint. So there is no USER here.

FROM python:3.11.13-slim-bookworm AS builder

# The project and its dependencies in a virtual environment the runtime stage copies whole.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# What setuptools builds from: pyproject.toml (and the readme it names), the py-modules and the
# packages of [tool.setuptools]. The agent needs only levers9/, but the package is one.
COPY pyproject.toml README.md worker_main.py attach_main.py ./
COPY levers9/ levers9/
COPY workflows/ workflows/
COPY activities/ activities/
RUN pip install --no-cache-dir .


FROM python:3.11.13-slim-bookworm

LABEL org.opencontainers.image.title="levers9-worker" \
      org.opencontainers.image.description="levers9 worker agent for GPU nodes of a Kubernetes pool"

# The container host: runc runs each task in its image, runsc (gVisor) a task of a pool that
# offers it, umoci unpacks a cached image and makes its runtime config, skopeo pulls images into
# the node's cache (levers9/agent/runc_runtime.py, runsc_runtime.py, images.py). Pinned to
# bookworm's upstream versions; the globs accept Debian's rebuilds. Each task's network of its
# own (levers9/agent/task_network.py): slirp4netns for its outbound NAT, nftables for the rules
# in it (util-linux's unshare and nsenter come with the base image); e2fsprogs' mkfs.ext4 for
# each task's writable layer, a filesystem of its own with a size cap, and for each durable disk
# (levers9/agent/disks.py). A task's workspace volumes (levers9/agent/volumes.py): rclone mounts
# the bucket with FUSE (fuse3's fusermount3 unmounts it); s3fs is the other backend measured.
# busybox-static: the relay into a runsc sandbox that carries a connection to its published
# port (levers9/agent/runsc_runtime.py; static, so it runs in any task's image).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       "runc=1.1.5+ds1-*" "runsc=0.0~20221219.0-*" "umoci=0.4.7+ds-*" "skopeo=1.9.3+ds1-*" \
       "busybox-static=1:1.35.0-*" \
       "slirp4netns=1.2.0-*" "nftables=1.0.6-*" "e2fsprogs=1.47.0-*" \
       "rclone=1.60.1+dfsg-*" "s3fs=1.90-*" "fuse3=3.14.0-*" \
    && rm -rf /var/lib/apt/lists/*

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/usr/local/nvidia/bin:/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PYTHONUNBUFFERED=1

# The Job's command is the same (levers9.core.manifests.WORKER_COMMAND, no args), so no CMD: the
# Job would drop it.
ENTRYPOINT ["levers9-worker"]
