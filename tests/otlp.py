"""An OTLP trace receiver for the tests, built on OpenTelemetry's own protocol messages (opentelemetry-proto): it
takes what an exporter sends over OTLP/HTTP (protobuf, ``POST /v1/traces``) or OTLP/gRPC, and keeps each span as
a ``ReceivedSpan``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as service_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as service_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.helpers import free_port


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as W3C's traceparent writes it
    span_id: str
    parent_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    status: int  # Status.StatusCode: 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(repr=False)


@dataclass
class Receiver:
    """The spans received so far (from any number of exporters), and the endpoint to give them."""

    endpoint: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: service_pb.ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            status=span.status.code,
                            resource=resource,
                        )
                    )
        with self.lock:
            self.spans += received

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0) -> list[ReceivedSpan]:
        """Every span received, once ``done`` says they are enough (else an AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(span.name, span.trace_id[:8]) for span in spans})
                raise AssertionError(f"the spans expected did not arrive in {timeout} s; received: {names}")
            time.sleep(0.05)


@contextmanager
def http_receiver() -> Iterator[Receiver]:
    """OTLP/HTTP with protobuf bodies on a free port of 127.0.0.1."""
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(service_pb.ExportTraceServiceRequest.FromString(body))
            answer = service_pb.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def grpc_receiver() -> Iterator[Receiver]:
    """OTLP/gRPC on a free port of 127.0.0.1."""
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}")

    class Traces(service_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            receiver.take(request)
            return service_pb.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(None)
