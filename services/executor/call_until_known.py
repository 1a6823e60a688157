"""Calls a provider by key until the outcome is known: call, look up on an unknown answer, and call again only
once the provider has no record of the key and no earlier call can still land."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import field
from datetime import UTC, datetime

import msgspec
from opentelemetry.context import Context

from crashsafe.contracts.errors import NOT_SENT, CrashsafeError, ErrorCode, RetryClass
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, Answer, Asked, Evidence
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain import key_facts
from crashsafe.domain.execution import (
    CallAgain,
    Done,
    LookUp,
    Next,
    after_call,
    after_lookup,
    made_by_another,
)
from crashsafe.domain.registry import ProviderAnswer, Tool
from crashsafe.domain.unknown_finality import StillUnknown, without_lookup
from crashsafe.services.platform import metrics
from crashsafe.services.providers.provider_calls import Providers


class OutcomeStillUnknown(CrashsafeError):
    """Neither the call nor the lookup could tell what happened; the message comes back later to ask again,
    unless the unknown is `final` (no later ask can change it): then the run is told at once."""

    code = ErrorCode.OUTCOME_UNKNOWN
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    # What was asked and answered on the way, for the outcome the message gets when it comes back.
    evidence: list[Evidence] = field(default_factory=list, kw_only=False, metadata=NOT_SENT)
    key: str
    final: bool = field(default=False, metadata=NOT_SENT)


# Metric children per tool (and outcome), made once; a provider's answer kind as the metric names it.
PROVIDER_CALLS_BY_TOOL = metrics.Children(metrics.PROVIDER_CALLS)
_PROVIDER_CALL_SECONDS = metrics.Children(metrics.PROVIDER_CALL_SECONDS)
_LOOKUPS = metrics.Children(metrics.LOOKUPS)
_CALL_OUTCOME = {Answer.OK: "succeeded", Answer.REJECTED: "failed", Answer.UNKNOWN: "unknown"}


async def call_until_known(
    providers: Providers,
    request: ActionRequest,
    tool: Tool,
    attempts: int,
    deliveries: int,
    look_first: bool,
    *,
    clock_skew_s: float,
    sent_at: float | None = None,
    ctx: Context | None = None,
    attempted: Callable[[int, float], Awaitable[None]] | None = None,
) -> ActionOutcome:
    """Call, and on an unknown answer look up by key; call again (same key) only once the provider has no
    record of it and no earlier call whose answer was unknown can still be in its hands. `sent_at`: when a
    previous life's (or a previous store's) last call with the key was sent (wall clock), if there was one."""
    trail: list[Evidence] = []
    contract = tool.contract
    # When the last call whose answer was unknown was sent (wall clock), and the clock skew to allow for (a
    # previous life's time may come from another host): it may commit until the window passes.
    unknown_sent_at, skew = sent_at, (clock_skew_s if sent_at is not None else 0.0)

    def note(asked: str, answer: ProviderAnswer) -> ProviderAnswer:
        trail.append(
            Evidence(
                asked=asked,
                key=request.key,
                answer=answer.kind,
                detail=answer.detail,
                at=datetime.now(UTC),
            )
        )
        return answer

    async def call(sent_wall: float) -> Next:
        nonlocal unknown_sent_at, skew
        started = time.monotonic()
        answer = note(
            Asked.PROVIDER_CALL,
            await providers.call(tool, request, step_timeout(request, contract), ctx=ctx),
        )
        _PROVIDER_CALL_SECONDS(request.tool).observe(time.monotonic() - started)
        PROVIDER_CALLS_BY_TOOL(request.tool, _CALL_OUTCOME.get(Answer(answer.kind), str(answer.kind))).inc()
        maker = made_by_another(key_facts.shared(request.key), answer, attempts)
        if maker is not None:  # the call's evidence line says whose effect this is
            trail[-1] = msgspec.structs.replace(trail[-1], detail=maker)
        if answer.kind == Answer.UNKNOWN:
            unknown_sent_at, skew = sent_wall, 0.0
        return after_call(request, contract, answer, attempts, deliveries)

    def in_flight_left() -> float:
        return key_facts.in_flight_left(contract.in_flight_window_s, unknown_sent_at, time.time(), skew)

    step: Next = LookUp() if look_first else await call(time.time())
    while True:
        match step:
            case Done(outcome=outcome):
                return msgspec.structs.replace(outcome, evidence=trail)
            case LookUp(delay_s=delay):
                if not providers.can_look_up(tool):
                    step = without_lookup(request.tool, delay)
                    continue
                if delay:
                    await asyncio.sleep(delay)  # the provider's Retry-After
                answer = note(
                    Asked.PROVIDER_LOOKUP,
                    await providers.lookup(
                        tool, request.key, step_timeout(request, contract), request.args, ctx=ctx
                    ),
                )
                _LOOKUPS(request.tool, str(answer.kind)).inc()
                step = after_lookup(
                    request,
                    contract,
                    answer,
                    attempts,
                    deliveries,
                    in_flight_left(),
                    lookup_informative=providers.lookup_informative(tool),
                )
            case CallAgain(delay_s=delay):
                await asyncio.sleep(delay)
                attempts += 1
                now = time.time()
                if attempted is not None:
                    # Durable before the call: a next life or a next store counts on from here and waits out
                    # this call's window before calling again.
                    await attempted(attempts, now)
                step = await call(now)
            case StillUnknown(detail=detail, final=final):
                raise OutcomeStillUnknown(
                    f"outcome of {request.key} still unknown: {detail}", trail, key=request.key, final=final
                )


def step_timeout(request: ActionRequest, contract: ToolContract) -> float:
    # The deadline passed down: never wait longer than the run has left, nor less than a sliver.
    remaining = (request.deadline_at - datetime.now(UTC)).total_seconds()
    return max(
        min(contract.timeout_s, request.timeout_s, remaining if remaining > 0 else contract.timeout_s),
        0.2,
    )
