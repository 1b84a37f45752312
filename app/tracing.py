"""OpenTelemetry traces: a span for each request and, under it, where its time went.

Configured by OpenTelemetry's own variables, read at start: on where an OTLP endpoint is named
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or an exporter asked for
(``OTEL_TRACES_EXPORTER=otlp`` or ``console``); off where neither is set, or with ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``. ``OTEL_EXPORTER_OTLP_PROTOCOL`` chooses ``http/protobuf`` (the default, port 4318)
or ``grpc`` (port 4317); ``OTEL_SERVICE_NAME`` (by default encoder-service), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER`` and its argument, ``OTEL_PROPAGATORS``, ``OTEL_BSP_*`` and the exporter's headers, timeout
and certificates are the SDK's own. The SDK and exporters are the ``otel`` extra (``encoder-service[otel]``).

Off, nothing of OpenTelemetry's SDK is imported and each hook on the request path is one test of ``TRACER``.

The spans (docs/operations.md, "Traces"):

- a request's span, a server span: ``POST /encode``, ``tei.v1.Embed/Embed``; it continues the incoming
  ``traceparent`` (HTTP header or gRPC metadata);
- under it ``tokenize`` (waiting for the loop turn's tokenizer call, and the call), ``queue`` (from entering the
  model's queue to its first pass), ``inference`` (first pass's start to last pass's end, linked to each pass) and,
  for HTTP, ``serialize`` (the answer written);
- ``pass``: one for each pass of the model, shared by the requests it carried: a child of the first traced
  request's span, linked to every one, with the pass's kind, texts, tokens and padded tokens;
- with the engine in a process of its own, the front end's ``engine`` span (the round trip) holds the engine
  process's ``queue``, ``inference`` and ``pass`` spans: the context crosses with the task.

The phases are measured as they already are (the queue's ticket, the pass's clock) and recorded as finished spans
with their own start and end times, on the event loop; only the ``pass`` span is made on the inference thread.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from app import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

TRACER: Tracer | None = None  # set by ``start`` where traces are wanted; None: off
_provider: TracerProvider | None = None
_finished: Callable[..., None] | None = None  # a finished span (ReadableSpan's arguments) to the export's queue

# perf_counter's readings (the queue's and the passes' clock) as epoch nanoseconds, as spans take them
_PERF0, _EPOCH0 = time.perf_counter(), time.time_ns()

EXTRA = "pip install 'encoder-service[otel]'"

# A span context as it crosses to the engine process: trace id, span id, trace flags
Carried = tuple[int, int, int]


class TracingUnavailable(RuntimeError):
    """Traces were asked for, and cannot be exported as asked: the message says why and what to do."""


def wanted(environ: Mapping[str, str] = os.environ) -> str | None:
    """The exporter OpenTelemetry's variables ask for, ``otlp`` or ``console``; None where traces are off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter in ("none", "console"):
        return None if exporter == "none" else "console"
    if exporter not in ("", "otlp"):
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={exporter}: traces are exported by otlp or console (or none)")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return "otlp" if endpoint or exporter == "otlp" else None


def protocol(environ: Mapping[str, str] = os.environ) -> str:
    """The OTLP protocol asked for (``http/protobuf`` unless said otherwise, as OpenTelemetry's specification has)."""
    asked = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    asked = (asked or "http/protobuf").strip().lower()
    if asked not in ("http/protobuf", "grpc"):
        raise TracingUnavailable(f"OTEL_EXPORTER_OTLP_PROTOCOL={asked}: traces are sent by http/protobuf or grpc")
    return asked


def check(environ: Mapping[str, str] = os.environ) -> None:
    """Raise TracingUnavailable where the variables ask for traces that cannot be exported (checked before a model
    loads, so that a misconfiguration is one line at start, not a surprise after)."""
    exporter = wanted(environ)
    if exporter is None:
        return
    modules = ["opentelemetry.sdk.trace"]
    if exporter == "otlp":
        kind = "grpc" if protocol(environ) == "grpc" else "http"
        modules.append(f"opentelemetry.exporter.otlp.proto.{kind}.trace_exporter")
    for module in modules:
        try:
            __import__(module)
        except ImportError as error:
            raise TracingUnavailable(
                f"traces are asked for by OpenTelemetry's variables, but {module} is not installed: {EXTRA}"
            ) from error


def _exporter(exporter: str) -> SpanExporter:
    if exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def start(role: str) -> bool:
    """Export this process's spans where the variables ask for it (``role``: service, front-end or engine, a
    resource attribute); whether traces are on. Raises TracingUnavailable (``check``)."""
    global TRACER, _provider, _finished
    if TRACER is not None:
        return True
    check()
    exporter = wanted()
    if exporter is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"process.pid": os.getpid(), "encoder.process": role})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "encoder-service"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    export = BatchSpanProcessor(_exporter(exporter))
    provider.add_span_processor(export)
    _provider, TRACER = provider, provider.get_tracer("encoder-service", __version__)
    _finished = _recorder(export, resource)
    return True


def _recorder(export: BatchSpanProcessor, resource: Resource) -> Callable[..., None]:
    """How ``record`` hands a finished span to the export: as the SDK's ReadableSpan, built at once (a sixth of what
    starting and ending a span costs, 3 µs against 20 on a 2-core AMD EPYC), since its times are already known."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = InstrumentationScope("encoder-service", __version__)

    def finished(**span: Any) -> None:
        export.on_end(ReadableSpan(resource=resource, instrumentation_scope=scope, **span))

    return finished


def stop() -> None:
    """Export what is left and stop (at the process's end)."""
    global TRACER, _provider, _finished
    provider, _provider, TRACER, _finished = _provider, None, None, None
    if provider is not None:
        provider.shutdown()


def epoch_ns(perf: float) -> int:
    """A reading of ``time.perf_counter`` as nanoseconds since the epoch."""
    return _EPOCH0 + int((perf - _PERF0) * 1e9)


def current() -> SpanContext | None:
    """The span the calling task runs under, where it is sampled; None otherwise (and where traces are off)."""
    if TRACER is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def record(
    name: str,
    parent: SpanContext,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any] | None = None,
    links: Iterable[SpanContext] = (),
) -> SpanContext | None:
    """A finished span under ``parent``, from ``start_ns`` to ``end_ns``; its context (None where traces are off).
    It is sampled as its parent is (a phase of a sampled request is always recorded)."""
    finished = _finished
    if finished is None:
        return None
    from opentelemetry import trace

    context = trace.SpanContext(
        parent.trace_id, random.getrandbits(64) or 1, False, parent.trace_flags, parent.trace_state
    )
    finished(
        name=name,
        context=context,
        parent=parent,
        attributes=dict(attributes or {}),
        links=tuple(trace.Link(link) for link in links),
        start_time=start_ns,
        end_time=end_ns,
    )
    return context


def server_span(name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any]) -> Span:
    """A request's span, started: it continues the trace of the ``traceparent`` in ``carrier`` (headers or gRPC
    metadata, as OTEL_PROPAGATORS reads them). Call only where TRACER is set."""
    from opentelemetry import propagate, trace

    assert TRACER is not None
    return TRACER.start_span(
        name, context=propagate.extract(carrier), kind=trace.SpanKind.SERVER, attributes=attributes
    )


def client_span(name: str, parent: SpanContext) -> Span:
    """A span under ``parent`` for work sent elsewhere (the engine), started. Call only where TRACER is set."""
    from opentelemetry import trace

    assert TRACER is not None
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    return TRACER.start_span(name, context=context, kind=trace.SpanKind.CLIENT)


def entered(span: Span) -> object:
    """Make ``span`` the calling task's current span; the token to give ``left``."""
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def left(token: object) -> None:
    from opentelemetry import context

    context.detach(token)  # type: ignore[arg-type]


def carried(span: Span) -> Carried:
    """A span's context as it crosses to another process."""
    context = span.get_span_context()
    return context.trace_id, context.span_id, int(context.trace_flags)


def continued(sent: Carried) -> object:
    """Make the span another process sent the calling task's parent; the token to give ``left``."""
    from opentelemetry import context, trace

    remote = trace.SpanContext(sent[0], sent[1], is_remote=True, trace_flags=trace.TraceFlags(sent[2]))
    return context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))


def trace_id(span: Span) -> str:
    """A span's trace id as the W3C header writes it (for the log line)."""
    return f"{span.get_span_context().trace_id:032x}"
