"""Traces and metrics, configured by the environment, off when it says nothing.

Traces: OpenTelemetry. The Temporal client and workers carry `temporalio.contrib.opentelemetry`'s
interceptor (a span per workflow start, workflow run, activity), and the activities open a span
around each Kubernetes, GCP and worker gRPC call (`span`). Spans go to an OTLP exporter when
the standard variables ask for one (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_TRACES_EXPORTER=otlp`); `OTEL_SERVICE_NAME` names
the service. Without them nothing is exported and the API calls are no-ops.

Metrics: the Temporal SDK's runtime metrics (task slots, poll and schedule latencies, ...) on a
Prometheus endpoint when `LEVERS9_METRICS_ADDRESS` (host:port) is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

TRACER = "levers9"
DEFAULT_SERVICE = "levers9-controlplane"
_OTLP_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_wanted(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "")
    return exporter == "otlp" or (exporter != "none" and any(env.get(v) for v in _OTLP_VARIABLES))


def setup_tracing(env: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Installs the OTLP exporter when the environment asks for one; None (tracing off)
    otherwise. Call once per process, before the first span."""
    if not tracing_wanted(env):
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    service = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def interceptors() -> list[TracingInterceptor]:
    """For the Temporal client and workers: spans for workflow starts, runs and activities
    (no-ops while no tracer provider is installed). Workflow runs get spans even without a
    parent (schedules start the reconcile passes)."""
    return [TracingInterceptor(trace.get_tracer(TRACER), always_create_workflow_spans=True)]


def runtime(env: Mapping[str, str] = os.environ) -> Runtime | None:
    """A Temporal runtime serving its metrics on `LEVERS9_METRICS_ADDRESS`; None: the default."""
    address = env.get("LEVERS9_METRICS_ADDRESS")
    if not address:
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))


@contextmanager
def span(name: str, **attributes: str | int | bool) -> Iterator[None]:
    """A span around one call to another system (`kubernetes list nodes`, `gcp get cluster`,
    `worker RunTask`); exceptions are recorded on it and raised."""
    with trace.get_tracer(TRACER).start_as_current_span(name, attributes=attributes):
        yield
