"""The gateway's ops surface on its own port: readiness over its seams, /metrics, and a count of every request."""

from __future__ import annotations

import time
from typing import Any

from litestar import Response, get
from litestar.datastructures import State
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from crashsafe.contracts.stream_routes import gateway_routes
from crashsafe.contracts.streams import active_spec, approvals_spec, clients_spec, sessions_spec, stream_specs
from crashsafe.services.platform import metrics, probes, seam_checks
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings

_REQUESTS = metrics.Children(metrics.GATEWAY_REQUESTS)
_REQUEST_SECONDS = metrics.Children(metrics.GATEWAY_REQUEST_SECONDS)


def checks(broker: Broker, settings: Settings) -> dict[str, probes.Check]:
    """NATS, every stream, the buckets the gateway reads and writes (API keys, active runs, approvals, session
    lanes), and that a guest's message and a wake land in the streams it expects. The gateway has no durable
    consumer of its own."""
    ns = settings.namespace
    return {
        **probes.basic_checks(
            broker,
            streams=[spec.name for spec in stream_specs(ns)],
            buckets=[clients_spec(ns), active_spec(ns), approvals_spec(ns), sessions_spec(ns)],
        ),
        **seam_checks.route_checks(broker, gateway_routes(ns)),
    }


async def readiness(state: State) -> Response[Any]:
    readiness = await probes.run_checks(checks(state.broker, state.settings))
    return Response(content=readiness.body(), status_code=200 if readiness.ready else 503)


@get("/metrics", summary="Prometheus metrics", include_in_schema=False, sync_to_thread=False)
def metrics_endpoint() -> Response[bytes]:
    # Anonymous, like the probes: its labels are route templates and status codes, never a caller's path or data.
    return Response(content=metrics.exposition(), media_type=metrics.CONTENT_TYPE)


def count_requests(app: ASGIApp) -> ASGIApp:
    """crashsafe_gateway_requests{route,status} and its latency. The route is the matched template
    (`/v1/runs/{run_id}`), so a caller cannot mint label values; a path that matches no route never reaches
    a route's middleware and is not counted."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # a handler that raised past every handler of errors

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            route = str(scope.get("path_template") or "unmatched")
            _REQUESTS(route, str(status)).inc()
            _REQUEST_SECONDS(route).observe(time.perf_counter() - started)

    return middleware
