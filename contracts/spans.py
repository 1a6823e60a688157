"""Span names and attribute keys at every boundary, so a trace reads in the contracts' own words."""

from __future__ import annotations

from enum import StrEnum


class SpanName(StrEnum):
    GATEWAY_REQUEST = "gateway.request"  # one HTTP request (root of a guest message's trace)
    RUNTIME_STEP = "runtime.step"  # one delivered event folded, decided, its outcome journaled
    MODEL_CALL = "model.call"  # one call to a model route
    ACTION_REQUEST = "action.request"  # the runtime journals and publishes an ActionRequested
    EXECUTOR_CALL = "executor.call"  # an executor serves one action request (claim, call, receipt)
    PROVIDER_CALL = "provider.call"  # one HTTP call to a provider (a write, or a lookup by key)
    PROJECTION_DELIVERY = "projection.delivery"  # a projector worker delivers one projection task
    RECONCILER_ASK = "reconciler.ask"  # the reconciler asks for an unknown outcome to be resolved


class SpanAttr(StrEnum):
    """Attribute keys: the contracts' field names, so a span joins a journal by a plain equality."""

    RUN_ID = "run_id"
    STEP_NO = "step_no"
    IDEMPOTENCY_KEY = "idempotency_key"
    TOOL = "tool"
    AGENT = "agent"
    EVENT_TYPE = "event_type"
    SERVICE = "service"
    OUTCOME = "outcome"
    ROUTE = "route"
    HTTP_METHOD = "http.request.method"
    HTTP_ROUTE = "http.route"
    HTTP_STATUS = "http.response.status_code"
    URL = "url.full"
