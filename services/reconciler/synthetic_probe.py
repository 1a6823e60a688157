"""The synthetic turn: a guest message from the scoped test tenant through the gateway, as a client sends one.

It crosses every seam a write does (gateway -> inbound -> runtime -> model port -> executor -> provider and
back to the journal) with one read: the `synthetic` agent's only tool is `search_hotels`. It goes through HTTP
with its own API key (scopes events:write and runs:read), so whoever runs it (`crashsafe check synthetic`, the
reconciler on its cadence) needs no NATS permission for the turn itself. The result (ok, slow, failed, why, how
long) is recorded apart from process health: the `crashsafe_synthetic_*` metrics and an `ops.synthetic` event."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import aiohttp

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.synthetic_turn import (
    DEFAULT_BUDGET_S,
    SYNTHETIC_AGENT,
    SYNTHETIC_PREFIX,
    SyntheticResult,
    SyntheticTurn,
    synthetic_encoder,
)
from crashsafe.domain.probe import Probe
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log

SEARCH_TOOL = "search_hotels"
CITY = "Lisbon"
# Between reads of the run while it is running: a turn takes a second or two on a healthy stack.
POLL_S = 0.2


def synthetic_text(today: date, city: str = CITY) -> str:
    """The probe's guest message: a search a month ahead (always in the future, never a write)."""
    check_in = today + timedelta(days=30)
    return f"{SYNTHETIC_PREFIX} {city} from {check_in.isoformat()} to {(check_in + timedelta(days=1)).isoformat()}"


def judge(events: Sequence[dict[str, Any]], probe: Probe | None = None) -> tuple[SyntheticResult, str]:
    """A finished synthetic run's journal (as `GET /v1/runs/{id}/events` gives it) -> its result and why. Pure.

    ok: the run completed, its search (a declared probe's calls, every one) succeeded, and it asked for nothing
    else. Anything else is failed, with the first thing that is wrong."""
    requested = {e.get("key"): e for e in events if e.get("type") == "run.action_requested"}
    allowed = probe.tools if probe is not None else frozenset({SEARCH_TOOL})
    others = sorted({str(e.get("tool")) for e in requested.values() if e.get("tool") not in allowed})
    if others:
        return (
            SyntheticResult.FAILED,
            f"the run asked for {', '.join(others)}: a synthetic turn only "
            + (f"reads ({', '.join(sorted(allowed))})" if probe is not None else "searches"),
        )
    ended = next((e for e in reversed(events) if e.get("type") in ("run.completed", "run.handed_off")), None)
    if ended is None:
        return SyntheticResult.FAILED, "the run has not ended"
    if ended["type"] == "run.handed_off":
        return (
            SyntheticResult.FAILED,
            f"handed off: {ended.get('reason')}: {str(ended.get('detail', ''))[:200]}",
        )
    if probe is not None:
        return _judge_probe(events, requested, probe, ended)
    searched = [
        e
        for e in events
        if e.get("type") == "run.action_completed"
        and requested.get(e.get("key"), {}).get("tool") == SEARCH_TOOL
    ]
    if not searched:
        return (
            SyntheticResult.FAILED,
            "completed without a search (the model answered without asking the tool)",
        )
    last = searched[-1]
    if last.get("status") != "succeeded":
        error = last.get("error") or {}
        return (
            SyntheticResult.FAILED,
            f"the search {last.get('status')}: {str(error.get('message', ''))[:200]}",
        )
    hotels = last.get("result", {}).get("hotels")
    found = len(hotels) if isinstance(hotels, list) else 0
    return SyntheticResult.OK, f"searched {found} hotel(s), answered: {str(ended.get('reply', ''))[:120]}"


def _judge_probe(
    events: Sequence[dict[str, Any]],
    requested: dict[Any, dict[str, Any]],
    probe: Probe,
    ended: dict[str, Any],
) -> tuple[SyntheticResult, str]:
    """A declared probe's completed run: each of its calls asked and answered with success."""
    done = [e for e in events if e.get("type") == "run.action_completed" and e.get("key") in requested]
    for completed in done:
        if completed.get("status") != "succeeded":
            tool = requested[completed.get("key")].get("tool")
            error = completed.get("error") or {}
            return (
                SyntheticResult.FAILED,
                f"{tool} {completed.get('status')}: {str(error.get('message', ''))[:200]}",
            )
    if len(done) < len(probe.calls):
        return (
            SyntheticResult.FAILED,
            f"completed after {len(done)} of the probe's {len(probe.calls)} call(s)",
        )
    return SyntheticResult.OK, f"{len(done)} call(s) answered, answered: {str(ended.get('reply', ''))[:120]}"


async def synthetic_turn(
    gateway_url: str,
    key: str,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    by: str = "cli",
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    probe: Probe | None = None,
) -> SyntheticTurn:
    """Run one turn within `budget_s` (the whole of it: accept, run, read back). Never raises: a gateway that does
    not answer, refuses the key or answers garbage is a `failed` result saying so; no answer in time is `slow`.
    `probe`: the registry's declared probe (its message, its calls judged); None: StayHub's search."""
    started = time.monotonic()
    run_id = ""
    result: SyntheticResult
    reason: str

    def elapsed() -> float:
        return round(time.monotonic() - started, 3)

    headers = {"Authorization": f"Bearer {key}"}
    base = gateway_url.rstrip("/")
    turn = secrets.token_hex(6)
    body = {
        "event_id": f"synthetic-{clock().strftime('%Y%m%dT%H%M%S')}-{turn}",
        "session_id": f"synthetic-{turn}",
        "guest_id": "synthetic-probe",
        "text": probe.text(clock().date()) if probe is not None else synthetic_text(clock().date()),
    }
    try:
        async with (
            asyncio.timeout(budget_s),
            aiohttp.ClientSession(headers=headers, raise_for_status=False) as http,
        ):
            async with http.post(f"{base}/v1/events", params={"agent": SYNTHETIC_AGENT}, json=body) as answer:
                accepted = await _json(answer)
                if answer.status != 202:
                    raise _Refused(f"the gateway answered {answer.status} to the event: {_said(accepted)}")
            run_id = str(accepted.get("run_id", ""))
            while True:
                async with http.get(f"{base}/v1/runs/{run_id}") as answer:
                    run = await _json(answer)
                    # 404: accepted (durable in the inbound stream) but not started by a runtime yet.
                    if answer.status not in (200, 404):
                        raise _Refused(f"the gateway answered {answer.status} to the run: {_said(run)}")
                if answer.status == 200 and run.get("status") != "running":
                    break
                await asyncio.sleep(POLL_S)
            async with http.get(f"{base}/v1/runs/{run_id}/events") as answer:
                journal = await _json(answer)
                if answer.status != 200:
                    raise _Refused(f"the gateway answered {answer.status} to the journal: {_said(journal)}")
            events = journal.get("events", [])
            if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
                raise _Refused(f"the gateway's journal is not a list of events: {str(events)[:200]}")
            result, reason = judge(events, probe)
    except TimeoutError:
        result = SyntheticResult.SLOW
        reason = f"no answer within the budget of {budget_s:g}s" + (
            f" (run {run_id} still running)" if run_id else " (the event was not accepted in time)"
        )
    except _Refused as exc:
        result, reason = SyntheticResult.FAILED, str(exc)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        result, reason = SyntheticResult.FAILED, f"the gateway at {base} did not answer: {exc}"[:300]
    return SyntheticTurn(
        result=result.value,
        reason=reason,
        duration_s=elapsed(),
        budget_s=budget_s,
        run_id=run_id,
        by=by,
        at=clock(),
    )


class _Refused(Exception):
    """The gateway answered, but not as a working stack does."""


async def _json(answer: aiohttp.ClientResponse) -> dict[str, Any]:
    try:
        body = await answer.json(content_type=None)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _said(body: dict[str, Any]) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        return f"{error.get('code', '')}: {str(error.get('message', ''))[:200]}"
    return str(body)[:200]


def record(turn: SyntheticTurn) -> None:
    """The turn's result in this process's metrics (the reconciler's /metrics for the cadence)."""
    metrics.SYNTHETIC_TURNS.labels(result=turn.result).inc()
    metrics.SYNTHETIC_UP.set(1 if turn.result == SyntheticResult.OK else 0)
    metrics.SYNTHETIC_SECONDS.observe(turn.duration_s)


async def publish_turn(broker: Broker, ns: Namespace, turn: SyntheticTurn, logger: logging.Logger) -> None:
    """The turn's result on `<ns>.ops.synthetic.<by>` for the history; a broker that is down loses only this."""
    try:
        await broker.publish(ns.ops("synthetic", turn.by), synthetic_encoder.encode(turn))
    except CrashsafeError as exc:
        log(logger, logging.WARNING, "synthetic turn's result not published", error=exc.message)
