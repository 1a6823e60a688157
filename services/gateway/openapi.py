"""The gateway's OpenAPI description: titles, status codes, bodies and errors the handlers really answer with.

Litestar derives paths and parameters from the routes; the handlers read their bodies themselves (the size limit
comes before the parse), so the request bodies and the typed error body are declared here and the served
document (`GET /schema/openapi.json`, to key holders) is completed with their msgspec schemas. docs/openapi.json is this document.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from crashsafe.contracts.approvals import ApprovalDecisionBody, ApprovalRecord
from crashsafe.contracts.inbound import GuestMessage
from crashsafe.contracts.release import VERSION
from crashsafe.domain.run_state import Summary

TITLE = "crashsafe gateway"
SCHEMA_PATH = "/schema"  # served to callers with a valid key only (app.py)
BEARER = "api_key"
SECURITY: list[dict[str, list[str]]] = [{BEARER: []}]


# Response bodies (what the handlers build as dicts, described as types) ------------------------------------------


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    code: str  # a stable `ErrorCode` value (open: a newer gateway may add codes)
    message: str  # what to do next, for a person
    details: dict[str, str | int | float | bool | list[str] | None] = {}


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every refusal: a stable code, a message saying what to do, the typed facts."""

    error: ErrorDetail


class Accepted(msgspec.Struct, frozen=True, kw_only=True):
    """The event is durable: the run it starts (or, a turn, the run it joins). `duplicate`: the same event was
    accepted before, and this answer is the first one's."""

    run_id: str
    duplicate: bool
    turn: bool = False  # the message joined a run already active in its session
    event_run_id: str = ""  # with `turn`: the run id the event itself would have started


@dataclass(frozen=True)
class RunView(Summary):
    """A run's state, folded from its journal, and the journal's last stream sequence."""

    last_seq: int = 0


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One journaled event as JSON (docs/events.md), with its stream sequence; other fields per `type`."""

    seq: int
    type: str
    run_id: str
    at: str


class RunEvents(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    events: list[JournalEntry]


class Reconciled(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    status: str
    asked: list[str]  # the keys the run was woken to resolve


class Approvals(msgspec.Struct, frozen=True, kw_only=True):
    approvals: list[ApprovalRecord]


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    ready: bool
    missing: list[str]  # streams (or `nats`) the gateway cannot reach
    # Every check by name (`nats`, `stream:<name>`, `bucket:<name>`): `ok`, or why it failed.
    checks: dict[str, str] = {}


# Errors per status ---------------------------------------------------------------------------------------------

_ERRORS = {
    400: "unreadable: not JSON, or an unknown agent (`invalid_request`)",
    401: "no API key, or one that is unknown, revoked or wrong (`unauthenticated`)",
    403: "the key lacks the scope this route needs (`forbidden`)",
    404: "no such run or approval, or another tenant's (`run_not_found`, `approval_not_found`)",
    409: (
        "the same key with another body, an approval already decided, a session of another guest, a run that"
        " took its most turns (`turn_limit_reached`)"
    ),
    413: "the body is over the limit (`body_too_large`), refused before it is read",
    422: "readable but not the schema (`invalid_request`)",
    429: (
        "over a rate, the active-runs cap or a run's unread messages (`rate_limited`, `too_many_active_runs`,"
        " `run_inbox_full`); see `Retry-After`"
    ),
    503: "NATS is unreachable or a record is contended: retry (`broker_unavailable`, `lease_conflict`)",
}


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    return {
        s: ResponseSpec(data_container=ErrorBody, description=_ERRORS[s], generate_examples=False)
        for s in statuses
    }


def ok(body: type[Any], description: str, status: int = 200) -> dict[int, ResponseSpec]:
    return {status: ResponseSpec(data_container=body, description=description, generate_examples=False)}


# Request bodies, by (path, method): the handlers read them, so Litestar does not see them ---------------------

REQUEST_BODIES: dict[tuple[str, str], tuple[type[msgspec.Struct], str]] = {
    ("/v1/events", "post"): (
        GuestMessage,
        "A guest's message; `?agent=` names the agent (default: the registry's default agent)",
    ),
    ("/v1/approvals/{approval_id}", "post"): (ApprovalDecisionBody, "A manager's decision"),
}


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """Litestar's document with the request bodies the handlers read themselves (msgspec's schemas)."""
    doc = copy.deepcopy(schema)
    refs, components = msgspec.json.schema_components(
        [body for body, _ in REQUEST_BODIES.values()], ref_template="#/components/schemas/{name}"
    )
    doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
    for ((path, method), (_, description)), ref in zip(REQUEST_BODIES.items(), refs, strict=True):
        doc["paths"][path][method]["requestBody"] = {
            "description": description,
            "required": True,
            "content": {"application/json": {"schema": ref}},
        }
    for operations in doc["paths"].values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            # Litestar adds its own validation answer to routes with path parameters; ours are typed `str` and
            # never fail it (a malformed id is our 404), so only a 400 a handler declares is real.
            if "$ref" not in responses.get("400", {}).get("content", {}).get("application/json", {}).get(
                "schema", {"$ref": ""}
            ):
                responses.pop("400", None)
    doc["components"]["schemas"] = dict(sorted(doc["components"]["schemas"].items()))
    return doc


class GatewaySchema(JsonRenderPlugin):
    """Serves the completed document at /schema/openapi.json; no HTML viewers (they load scripts from a CDN)."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.render_json(request, complete(openapi_schema))


def config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title=TITLE,
        version=VERSION,  # the release's one home (an editable install's metadata keeps an old version)
        description="Accepts guest events and answers runs, journals and approvals. docs/events.md describes "
        "what happens behind it; every error body is `ErrorBody`.",
        path=SCHEMA_PATH,
        render_plugins=[GatewaySchema()],
        components=Components(
            security_schemes={
                BEARER: SecurityScheme(
                    type="http",
                    scheme="bearer",
                    bearer_format="csk_<key_id>_<secret>",
                    description="An API key made by `crashsafe keys create`; its scopes decide the routes.",
                )
            }
        ),
        use_handler_docstrings=True,
    )


def document() -> dict[str, Any]:
    """The document the gateway serves, built from its app without starting it."""
    from litestar._openapi.plugin import OpenAPIPlugin

    from crashsafe.domain.registry import load
    from crashsafe.services.gateway.app import build_app
    from crashsafe.services.platform.settings import Settings

    settings = Settings()
    with warnings.catch_warnings():
        # Litestar warns of its inferred path-parameter style while building routes; the gateway's process runs
        # with warnings on, this one build (the tests run warnings as errors) does not change behaviour.
        warnings.simplefilter("ignore", DeprecationWarning)
        app = build_app(settings, load(settings.registry))
        return complete(app.plugins.get(OpenAPIPlugin).provide_openapi_schema())
