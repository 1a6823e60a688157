"""Provider adapters: each tool's HTTP call, keyed, and its "what happened to key K?" lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_aiohttp import HttpxAiohttpClient

from contracts.subjects import Header
from contracts.tool_messages import ActionRequest
from services.executor.core import ProviderAnswer

Call = Callable[[httpx.AsyncClient, ActionRequest, float], Awaitable[ProviderAnswer]]
Lookup = Callable[[httpx.AsyncClient, str, float], Awaitable[ProviderAnswer]]


@dataclass(frozen=True, slots=True)
class Operation:
    call: Call
    lookup: Lookup | None
    ref_field: str | None
    # Arguments the call cannot be made without: checked before any intent is committed.
    requires: tuple[str, ...] = ()
    # False where the provider keeps no record to audit (a no-op leaves nothing behind).
    audited: bool = True

    def missing(self, args: dict[str, Any]) -> list[str]:
        return [name for name in self.requires if args.get(name) in (None, "")]


def provider_client(base_url: str) -> httpx.AsyncClient:
    """The executors' HTTP client: httpx's API on an aiohttp transport (httpcore cost half an executor's CPU)."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    return HttpxAiohttpClient(base_url=base_url, limits=limits)


def _json(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _classify(response: httpx.Response, ref_field: str | None) -> ProviderAnswer:
    body = _json(response)
    if response.status_code >= 500:
        return ProviderAnswer("unknown", {}, detail=f"provider answered {response.status_code}")
    if body is None:
        return ProviderAnswer(
            "unknown", {}, detail=f"provider answered {response.status_code} with a body that is not JSON"
        )
    if 200 <= response.status_code < 300:
        return ProviderAnswer(
            "ok", body, ref=str(body.get(ref_field)) if ref_field and body.get(ref_field) else None
        )
    error = body.get("error", body)
    return ProviderAnswer(
        "rejected",
        error if isinstance(error, dict) else {"message": str(error)},
        detail=f"provider answered {response.status_code}",
    )


def _post(
    path: Callable[[ActionRequest], str], body: Callable[[ActionRequest], dict[str, Any]], ref_field: str
) -> Call:
    async def call(client: httpx.AsyncClient, request: ActionRequest, timeout: float) -> ProviderAnswer:
        try:
            response = await client.post(
                path(request),
                json=body(request),
                headers={Header.IDEMPOTENCY_KEY: request.key},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            # Timeout or dropped connection after sending: the provider may or may not have committed it.
            return ProviderAnswer("unknown", {}, detail=f"{type(exc).__name__}: {exc}")
        return _classify(response, ref_field)

    return call


def _by_key(prefix: str, ref_field: str) -> Lookup:
    async def lookup(client: httpx.AsyncClient, key: str, timeout: float) -> ProviderAnswer:
        try:
            response = await client.get(f"{prefix}/by-key/{key}", timeout=timeout)
        except httpx.HTTPError as exc:
            return ProviderAnswer("unknown", {}, detail=f"lookup failed: {type(exc).__name__}: {exc}")
        if response.status_code == 404:
            return ProviderAnswer("absent", {})
        answer = _classify(response, ref_field)
        return (
            ProviderAnswer("found", answer.body, answer.ref)
            if answer.kind == "ok"
            else ProviderAnswer("unknown", {}, detail=answer.detail)
        )

    return lookup


async def _search(client: httpx.AsyncClient, request: ActionRequest, timeout: float) -> ProviderAnswer:
    try:
        response = await client.get("/hotels/search", params=request.args, timeout=timeout)
    except httpx.HTTPError as exc:
        return ProviderAnswer("unknown", {}, detail=f"{type(exc).__name__}: {exc}")
    return _classify(response, None)


async def _noop(client: httpx.AsyncClient, request: ActionRequest, timeout: float) -> ProviderAnswer:
    if request.args.get("sleep_ms"):
        await asyncio.sleep(int(request.args["sleep_ms"]) / 1000)
    return ProviderAnswer("ok", {"done": True, **request.args}, ref=request.key)


async def _noop_lookup(client: httpx.AsyncClient, key: str, timeout: float) -> ProviderAnswer:
    return ProviderAnswer("absent", {})  # a no-op leaves nothing behind: calling it again is the same as once


OPERATIONS: dict[str, Operation] = {
    "search_hotels": Operation(_search, None, None, requires=("city", "check_in", "check_out")),
    "create_booking": Operation(
        _post(lambda r: "/bookings", lambda r: r.args, "booking_id"),
        _by_key("/bookings", "booking_id"),
        "booking_id",
        requires=("hotel_id", "guest_id", "check_in", "check_out"),
    ),
    "release_booking": Operation(
        _post(lambda r: f"/bookings/{r.args['booking_id']}/release", lambda r: {}, "booking_id"),
        _by_key("/booking-releases", "booking_id"),
        "booking_id",
        requires=("booking_id",),
    ),
    "create_payment": Operation(
        _post(lambda r: "/payments", lambda r: r.args, "payment_id"),
        _by_key("/payments", "payment_id"),
        "payment_id",
        requires=("booking_id", "guest_id", "amount_cents", "currency"),
    ),
    "refund_payment": Operation(
        _post(
            lambda r: f"/payments/{r.args['payment_id']}/refund",
            lambda r: {"amount_cents": r.args["amount_cents"]},
            "refund_id",
        ),
        _by_key("/refunds", "refund_id"),
        "refund_id",
        requires=("payment_id", "amount_cents"),
    ),
    "send_confirmation_email": Operation(
        _post(
            lambda r: "/emails",
            lambda r: {
                "guest_id": r.args["guest_id"],
                "template": "booking_confirmation",
                "booking_id": r.args["booking_id"],
            },
            "email_id",
        ),
        _by_key("/emails", "email_id"),
        "email_id",
        requires=("guest_id", "booking_id"),
    ),
    "update_crm": Operation(
        _post(
            lambda r: "/crm/updates",
            lambda r: {
                "guest_id": r.args["guest_id"],
                "booking_id": r.args["booking_id"],
                "fields": {"last_booking_id": r.args["booking_id"]},
            },
            "crm_update_id",
        ),
        _by_key("/crm/updates", "crm_update_id"),
        "crm_update_id",
        requires=("guest_id", "booking_id"),
    ),
    "noop": Operation(_noop, _noop_lookup, None, audited=False),
}
