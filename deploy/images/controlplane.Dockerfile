# The levers9 controlplane image: the Temporal worker and the gateway the workers dial, one
# process (`python -m worker_main`), plus Debian's skopeo, which the image copy (attach, image
# recopy: activities/images.py) runs.
#
# Build from the repository root; the context is the repository, filtered by /.dockerignore:
#   docker build -f deploy/images/controlplane.Dockerfile -t levers9/controlplane:0.1.0 .
#
# deploy/helm/levers9-controlplane runs it as UID/GID 10001 with a read-only root filesystem and
# an emptyDir on /tmp, passing the two values files it mounts (the same as CMD below):
#   --values /etc/levers9/config/values.yaml --values /etc/levers9/private/values.json
#
# Ports: the gateway's gRPC (gatewayListen; its default, 127.0.0.1:7443, is loopback only, so
# the chart sets config.controlplane.gatewayListen to 0.0.0.0:<port>; the image sets no
# LEVERS9_GATEWAY_LISTEN because the environment would win over the chart's values) and the
# Temporal runtime's Prometheus metrics, served only when LEVERS9_METRICS_ADDRESS is set (the
# chart sets 0.0.0.0:9464).

FROM python:3.11.13-slim-bookworm AS builder

# The project and its dependencies in a virtual environment the runtime stage copies whole.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# What setuptools builds from: pyproject.toml (and the readme it names), the py-modules and the
# packages of [tool.setuptools].
COPY pyproject.toml README.md worker_main.py attach_main.py ./
COPY levers9/ levers9/
COPY workflows/ workflows/
COPY activities/ activities/
RUN pip install --no-cache-dir .


FROM python:3.11.13-slim-bookworm

LABEL org.opencontainers.image.title="levers9-controlplane" \
      org.opencontainers.image.description="levers9 controlplane: Temporal worker and gateway of the Kubernetes GPU pool"

# skopeo copies the worker image from ECR into the cluster's Artifact Registry. Pinned to
# bookworm's upstream version; the glob accepts Debian's rebuilds (+bN) of it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "skopeo=1.9.3+ds1-*" \
    && rm -rf /var/lib/apt/lists/*

# A numeric, non-root user (runAsNonRoot can only verify a numeric USER).
RUN groupadd --system --gid 10001 levers9 \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/levers9 \
        --shell /usr/sbin/nologin levers9

COPY --from=builder /opt/venv /opt/venv

# TMPDIR: skopeo's big temporary files default to /var/tmp, which a read-only root filesystem
# refuses; /tmp is the chart's emptyDir. GRPC_EXPERIMENTS: levers9.GRPC_EXPERIMENTS (gRPC's TCP
# on its iomgr path; worker_main imports grpc before levers9 could set it).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TMPDIR=/tmp \
    GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener

USER 10001:10001
WORKDIR /home/levers9

EXPOSE 7443 9464

ENTRYPOINT ["python", "-m", "worker_main"]
CMD ["--values", "/etc/levers9/config/values.yaml", "--values", "/etc/levers9/private/values.json"]
