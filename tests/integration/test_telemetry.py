"""Traces, with the in-memory exporter: one reconcile pass and one task leave the spans an
operator follows (workflow runs and activities from the Temporal interceptor, and a span around
each Kubernetes and worker call, inside its activity's span); and the exporter is off unless the
standard OTEL_* variables ask for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from levers9.models import task_workflow_id
from levers9.telemetry import tracing_wanted
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment,
    tmp_path_factory: pytest.TempPathFactory,
    spans: InMemorySpanExporter,
) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("otel"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=60)
        yield plane


def _named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_a_reconcile_pass_is_traced(cp: Controlplane, spans: InMemorySpanExporter) -> None:
    [observe, *_] = _named(spans, "kubernetes observe pool")
    assert observe.attributes is not None
    assert observe.attributes["pool_name"] == POOL
    runs = _named(spans, "RunWorkflow:ReconcilePoolWorkflow")
    activities = _named(spans, "RunActivity:observe_pool")
    assert runs
    assert activities
    # The Kubernetes span sits inside the activity's, in the pass's trace.
    traces = {a.context.trace_id for a in activities if a.context is not None}
    assert observe.context is not None
    assert observe.context.trace_id in traces
    assert _named(spans, "kubernetes create worker Job")


async def test_a_task_is_traced_to_the_worker_call(
    cp: Controlplane, spans: InMemorySpanExporter
) -> None:
    done = await cp.cli("run", "--pool", POOL, "--", "true")
    assert done.returncode == 0, done.stdout + done.stderr

    async def traced() -> bool:
        names = {s.name for s in spans.get_finished_spans()}
        return {"worker RunTask", "RunWorkflow:TaskWorkflow"} <= names

    await eventually(traced, within=30)
    [call, *_] = _named(spans, "worker RunTask")
    assert call.attributes is not None
    assert call.attributes["tunnel"] is False
    # The worker call sits inside the run_task activity's span.
    activities = {s.context.span_id: s for s in _named(spans, "RunActivity:run_task") if s.context}
    assert call.parent is not None
    assert call.parent.span_id in activities


def test_export_is_off_unless_the_environment_asks() -> None:
    assert not tracing_wanted({})
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing_wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}
    )
    assert not tracing_wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": "none"}
    )


async def test_the_temporal_ui_reads_activity_summaries(cp: Controlplane) -> None:
    """Each activity of a task's history says what it does (the Temporal UI shows these)."""
    done = await cp.cli("run", "--pool", POOL, "--gpus", "2", "--", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = done.stdout.split()[1]
    client = await connect(cp.settings)
    history = await client.get_workflow_handle(task_workflow_id(task_id)).fetch_history()
    converter = client.data_converter.payload_converter
    summaries = [
        converter.from_payload(event.user_metadata.summary, str)
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.user_metadata.HasField("summary")
    ]
    assert summaries[0] == "placement: waiting for one worker with 2 free cards"
    assert summaries[1].startswith("RunTask on worker ")
    assert "cards " in summaries[1]
