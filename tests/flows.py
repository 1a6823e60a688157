"""Test helpers that act as a guest and an operator: submit a booking, wait for its end, count the ledger."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx

from crashsafe.stack import Stack

BOOKING_TEXT = "Book a room in Lisbon from 2026-12-01 to 2026-12-03"


async def submit(
    stack: Stack,
    text: str = BOOKING_TEXT,
    guest: str | None = None,
    key: str | None = None,
    deadline_s: float = 60,
) -> str:
    """POST a guest event like a careful client: a dropped connection or 503 is retried with the same key."""
    guest = guest or f"guest-{uuid.uuid4().hex[:8]}"
    body = {
        "event_id": key or f"evt-{uuid.uuid4().hex}",
        "session_id": f"sess-{guest}",
        "guest_id": guest,
        "text": text,
    }
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as client:
        while True:
            try:
                response = await client.post("/v1/events", json=body)
                if response.status_code == 202:
                    return str(response.json()["run_id"])
                if response.status_code != 503:
                    raise AssertionError(f"gateway answered {response.status_code}: {response.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("gateway never accepted the event")
            await asyncio.sleep(0.2)


async def wait_terminal(stack: Stack, run_id: str, deadline_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as client:
        while time.monotonic() < deadline:
            try:
                response = await client.get(f"/v1/runs/{run_id}")
                if response.status_code == 200 and response.json()["status"] != "running":
                    return dict(response.json())
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} not terminal after {deadline_s}s; logs in {stack.logs_dir}")


async def journal(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as client:
        response = await client.get(f"/v1/runs/{run_id}/events")
        response.raise_for_status()
        return list(response.json()["events"])


async def ledger(stack: Stack, guest_id: str | None = None) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.sandbox_url, timeout=10) as client:
        response = await client.get("/_ledger", params={"guest_id": guest_id} if guest_id else None)
        response.raise_for_status()
        return dict(response.json())


def effects_per_run(entries: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Ledger effects grouped by the run that keyed them (keys are run_id:step...)."""
    out: dict[str, dict[str, int]] = {}
    for entry in entries:
        run_id = str(entry["key"]).split(":", 1)[0]
        kinds = out.setdefault(run_id, {})
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    return out
