"""An OTLP/HTTP trace receiver on a free port: what a collector would be to the stack, keeping every span it got."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    service: str  # its resource's service.name
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    start_ns: int


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Collector:
    """What every process exported; `url` is what OTEL_EXPORTER_OTLP_ENDPOINT is set to."""

    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    batches: int = 0

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.batches += 1
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            service=str(resource.get("service.name", "")),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            status=s.status.code,
                            start_ns=s.start_time_unix_nano,
                        )
                    )


@asynccontextmanager
async def otlp_collector() -> AsyncIterator[Collector]:
    collector = Collector()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        collector.take(body)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    collector.url = f"http://127.0.0.1:{port}"
    try:
        yield collector
    finally:
        await runner.cleanup()


def tree(spans: list[ReceivedSpan]) -> str:
    """The spans as an indented tree (children in start order), each with its service."""
    children: dict[str, list[ReceivedSpan]] = {}
    for s in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(s.parent_id, []).append(s)
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def walk(s: ReceivedSpan, depth: int) -> None:
        extra = " ".join(
            f"{k}={s.attributes[k]}" for k in ("tool", "step_no", "event_type") if k in s.attributes
        )
        lines.append(f"{'  ' * depth}{s.name}  [{s.service}] {extra}".rstrip())
        for child in children.get(s.span_id, []):
            walk(child, depth + 1)

    for root in [s for s in spans if s.parent_id not in ids]:
        walk(root, 0)
    return "\n".join(lines)
