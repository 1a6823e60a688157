"""Drives a whole running stack from a test: guest events in, runs to their end, journals, ledgers and dead letters out."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec

from contracts.dead_letters import DeadLetter, dead_letter_decoder
from contracts.run_events import ActionRequested, event_decoder, request_for
from contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace, StreamKind
from contracts.tool_messages import ActionOutcome, ActionRequest, Evidence
from services.platform.jetstream import Broker
from crashsafe.stack import Stack

LISBON = "Book a room in Lisbon from 2026-12-01 to 2026-12-03"
BOOKED_AND_PAID = {"booking": 1, "booking_release": 0, "charge": 1, "refund": 0, "email": 1, "crm_update": 1}
T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def eventually(
    check: Callable[[], Awaitable[T] | T], *, what: str, timeout_s: float = 60.0, every_s: float = 0.1
) -> T:
    """Poll `check` (sync or async) until it returns something truthy; the machine is shared and slow, so the
    deadline is generous. Returns that value."""

    async def ask() -> T:
        value = check()
        return await value if inspect.isawaitable(value) else value  # type: ignore[return-value]

    deadline = time.monotonic() + timeout_s
    last = await ask()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout_s:.0f}s (last: {last!r})")
        await asyncio.sleep(every_s)
        last = await ask()
    return last


async def start_stack(nats_url: str, state_dir: Path, namespace: str, **kwargs: Any) -> Stack:
    """Start a stack without blocking the test's event loop (starting waits on every service's readiness)."""
    stack = Stack(state_dir, nats_url=nats_url, namespace=namespace, **kwargs)
    return await asyncio.to_thread(stack.start)


async def stop_stack(stack: Stack) -> None:
    await asyncio.to_thread(stack.stop)


@asynccontextmanager
async def shared_client(nats_url: str, state_dir: Path, **kwargs: Any) -> AsyncIterator[StackClient]:
    """One stack for a whole test module, in its own namespace; tests keep apart by guest id."""
    stack = await start_stack(nats_url, state_dir, f"t{uuid.uuid4().hex[:10]}", **kwargs)
    client = StackClient(stack)
    try:
        yield client
    finally:
        await client.aclose()
        await stop_stack(stack)


class StackClient:
    """The gateway and the sandbox of one stack, as a guest and an operator see them over HTTP."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.ns = Namespace(stack.namespace)
        self.http = httpx.AsyncClient(timeout=20.0)

    async def aclose(self) -> None:
        await self.http.aclose()

    # The guest and the operator ----------------------------------------------------------------------------

    async def post_event(
        self, event_id: str, guest_id: str, text: str = LISBON, agent: str | None = None
    ) -> httpx.Response:
        body = {"event_id": event_id, "session_id": f"s-{event_id}", "guest_id": guest_id, "text": text}
        params = {"agent": agent} if agent else None
        return await self.http.post(f"{self.stack.gateway_url}/v1/events", json=body, params=params)

    async def start_run(
        self, guest_id: str | None = None, text: str = LISBON, agent: str | None = None
    ) -> tuple[str, str]:
        """Submit a fresh guest event; returns (run_id, guest_id)."""
        guest_id = guest_id or unique("g")
        response = await self.post_event(unique("ev"), guest_id, text, agent)
        assert response.status_code == 202, response.text
        return response.json()["run_id"], guest_id

    async def summary(self, run_id: str) -> dict[str, Any] | None:
        response = await self.http.get(f"{self.stack.gateway_url}/v1/runs/{run_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    async def wait_terminal(self, run_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        async def ended() -> dict[str, Any] | None:
            summary = await self.summary(run_id)
            return summary if summary is not None and summary["status"] != "running" else None

        return await eventually(ended, what=f"run {run_id} to end", timeout_s=timeout_s)

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"{self.stack.gateway_url}/v1/runs/{run_id}/events")
        response.raise_for_status()
        return response.json()["events"]  # type: ignore[no-any-return]

    async def reconcile(self, run_id: str) -> httpx.Response:
        return await self.http.post(f"{self.stack.gateway_url}/v1/runs/{run_id}/reconcile")

    # The sandbox -------------------------------------------------------------------------------------------

    async def ledger(self, guest_id: str | None = None) -> dict[str, Any]:
        params = {"guest_id": guest_id} if guest_id else None
        response = await self.http.get(f"{self.stack.sandbox_url}/_ledger", params=params)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    async def counts(self, guest_id: str) -> dict[str, int]:
        return (await self.ledger(guest_id))["counts"]  # type: ignore[no-any-return]

    async def arm(self, target: str, **fault: int) -> None:
        response = await self.http.put(f"{self.stack.sandbox_url}/_faults", json={"target": target, **fault})
        assert response.status_code == 200, response.text

    async def faults(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.stack.sandbox_url}/_faults")
        response.raise_for_status()
        return response.json()["faults"]  # type: ignore[no-any-return]

    async def clear_faults(self) -> None:
        response = await self.http.delete(f"{self.stack.sandbox_url}/_faults")
        assert response.status_code == 200, response.text


# Reading journals ------------------------------------------------------------------------------------------


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def step(events: list[dict[str, Any]], tool: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The one journaled request for `tool`, and its completion if there is one."""
    requested = [e for e in of_type(events, "run.action_requested") if e["tool"] == tool]
    assert len(requested) == 1, f"expected one {tool} request, journal has {len(requested)}"
    request = requested[0]
    done = [e for e in of_type(events, "run.action_completed") if e["step_no"] == request["step_no"]]
    assert len(done) <= 1, f"{tool} step {request['step_no']} completed {len(done)} times"
    return request, (done[0] if done else None)


def trail(completed: dict[str, Any]) -> list[tuple[str, str]]:
    """The evidence of a receipt as (asked, answer) pairs, in the order they were asked."""
    return [(e["asked"], e["answer"]) for e in completed["evidence"]]


def action_request_from(requested: dict[str, Any]) -> ActionRequest:
    """Rebuild the message the runtime published for a journaled run.action_requested event (the product's rule)."""
    intent = event_decoder.decode(msgspec.json.encode(requested))
    assert isinstance(intent, ActionRequested)
    return request_for(intent)


def action_outcome_from(requested: dict[str, Any], completed: dict[str, Any]) -> ActionOutcome:
    """Rebuild the executor's outcome message from a journaled request and its run.action_completed event."""
    return ActionOutcome(
        run_id=completed["run_id"],
        step_no=completed["step_no"],
        tool=requested["tool"],
        key=completed["key"],
        status=completed["status"],
        result=completed["result"],
        provider_ref=completed["provider_ref"],
        via=completed["via"],
        attempts=completed["attempts"],
        deliveries=completed["deliveries"],
        evidence=[
            Evidence(
                asked=e["asked"], key=e["key"], answer=e["answer"], detail=e["detail"], at=_time(e["at"])
            )
            for e in completed["evidence"]
        ],
    )


def action_subject(ns: Namespace, family: str, key: str) -> str:
    return ns.actions_for_key(family, key, DEFAULT_ACTION_PARTITIONS)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


# Reading the broker ----------------------------------------------------------------------------------------


async def dead_letters(broker: Broker, ns: Namespace) -> list[DeadLetter]:
    stored = await broker.read_subject(ns.stream(StreamKind.DEAD_LETTERS), ns.dead_letters_all)
    return [dead_letter_decoder.decode(m.data) for m in stored]


async def consumer_settled(broker: Broker, stream: str, durable: str, seq: int) -> bool:
    """The durable consumer has settled (acked or termed) every message up to stream sequence `seq`."""
    info = await broker.js.consumer_info(stream, durable)
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    return floor >= seq and not info.num_ack_pending
