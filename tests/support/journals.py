"""Reading run journals in tests, and rebuilding the wire messages a journal implies.

Journals come two ways: as JSON objects from `GET /v1/runs/{id}/events` (what an operator sees), or as typed
events read straight from the RUNS stream. Helpers that make sense for both accept both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalRequested,
    ModelAnswered,
    PolicyDenied,
    RunEvent,
    ToolRejected,
    event_decoder,
)
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, Evidence
from tests.support.capabilities import signed

# The events that take a step number: the fold numbers them 1, 2, 3 ... with no gap and no repeat.
DECISIONS = (ModelAnswered, ActionRequested, ToolRejected, PolicyDenied, ApprovalRequested)
DECISION_TYPES = (
    "run.model_answered",
    "run.action_requested",
    "run.tool_rejected",
    "run.policy_denied",
    "run.approval_requested",
)


def decision_steps(events: list[RunEvent] | list[dict[str, Any]]) -> list[int]:
    """The step numbers of the decisions in a journal, in journal order."""
    return [
        int(e["step_no"]) if isinstance(e, dict) else e.step_no  # type: ignore[union-attr]
        for e in events
        if (e["type"] in DECISION_TYPES if isinstance(e, dict) else isinstance(e, DECISIONS))
    ]


# Journals as the gateway serves them --------------------------------------------------------------------------


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
    """Rebuild the message the runtime published for a journaled run.action_requested (the product's rule),
    signed as the runtime signs it."""
    intent = event_decoder.decode(msgspec.json.encode(requested))
    assert isinstance(intent, ActionRequested)
    return signed(request_for(intent))


def action_outcome_from(requested: dict[str, Any], completed: dict[str, Any]) -> ActionOutcome:
    """Rebuild the executor's outcome message from a journaled request and its run.action_completed."""
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
                asked=e["asked"],
                key=e["key"],
                answer=e["answer"],
                detail=e["detail"],
                at=datetime.fromisoformat(e["at"]),
            )
            for e in completed["evidence"]
        ],
    )


# Typed journals -----------------------------------------------------------------------------------------------


def receipt_of(events: list[RunEvent], tool: str) -> ActionCompleted:
    """The completion of the (first) step that asked for `tool`."""
    request = next(e for e in events if isinstance(e, ActionRequested) and e.tool == tool)
    return next(e for e in events if isinstance(e, ActionCompleted) and e.step_no == request.step_no)
