"""The synthetic turn's pure parts: the fixed model route's answers, the judge of a finished turn's journal, the
read-only agent, and the degraded mode of missing policy documents (which turns hand off, which go on)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.run_events import (
    ActionRequested,
    Budget,
    HandOffReason,
    RunHandedOff,
    ToolRejected,
    event_encoder,
)
from crashsafe.contracts.synthetic_turn import FIXED_MODEL, SYNTHETIC_TENANT, SyntheticResult, SyntheticTurn
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.catalog_check import builtin_catalog, validate_catalog
from crashsafe.domain.decide import Append, AskModel, next_move, policy_unavailable
from crashsafe.domain.model_calls import model_answered
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.retrieval import policy_question
from crashsafe.examples.analytics.core import Figures, fold
from crashsafe.replay_check import divergences
from crashsafe.services.agents import stayhub
from crashsafe.services.agents.synthetic_agent import FIXED_ROUTE, SyntheticAgent
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import metrics
from crashsafe.services.reconciler.synthetic_probe import judge, record, synthetic_text
from crashsafe.services.runtime.fixed_model import NOT_SYNTHETIC, fixed_answer
from crashsafe.services.runtime.model import read_response
from tests.support.runs import BOOKING, T0, Run, call, receipt, reply_of, started

AGENT = SyntheticAgent()
REGISTRY = stayhub()
TEXT = synthetic_text(date(2026, 12, 1))


def _said(items: tuple[dict[str, Any], ...]) -> Any:
    return read_response(fixed_answer(items), FIXED_MODEL)


# The fixed route ----------------------------------------------------------------------------------------------


def test_the_fixed_route_asks_for_the_search_the_message_names_then_answers_with_its_result() -> None:
    assert TEXT == "synthetic search Lisbon from 2026-12-31 to 2027-01-01"
    first = _said(({"role": "user", "content": TEXT},))
    (asked,) = first.tool_calls
    assert asked.name == "search_hotels" and first.reply is None
    assert json.loads(asked.arguments) == {
        "city": "Lisbon",
        "check_in": "2026-12-31",
        "check_out": "2027-01-01",
    }
    output = {"type": "function_call_output", "call_id": asked.call_id, "output": '{"hotels": [{}, {}]}'}
    second = _said(({"role": "user", "content": TEXT}, output))
    assert second.tool_calls == () and second.reply == "synthetic: ok: 2 hotel(s) found"
    failed = {**output, "output": '{"error": {"message": "provider answered 503"}, "status": "failed"}'}
    assert "search failed: provider answered 503" in str(
        _said(({"role": "user", "content": TEXT}, failed)).reply
    )


def test_the_fixed_route_is_deterministic_and_asks_for_nothing_on_another_message() -> None:
    items = ({"role": "user", "content": TEXT},)
    assert fixed_answer(items) == fixed_answer(items)
    other = _said(({"role": "user", "content": "obey: create_booking {}"},))
    assert other.tool_calls == () and other.reply == NOT_SYNTHETIC


# The agent ----------------------------------------------------------------------------------------------------


def test_the_synthetic_agent_offers_only_the_search_on_the_fixed_route_and_validates() -> None:
    assert set(AGENT.tools) == {"search_hotels"} and AGENT.compensation_tools == {}
    assert REGISTRY.model_tools["synthetic"] == frozenset({"search_hotels"})
    assert AGENT.config.routes == [FIXED_ROUTE] and FIXED_ROUTE.api == "fixed"
    assert validate_catalog(builtin_catalog(REGISTRY), REGISTRY) == []


def test_a_synthetic_run_asking_for_a_write_is_refused_before_anything_is_journaled_as_requested() -> None:
    run = Run(started(agent="synthetic", budget=Budget(max_steps=4)))
    assert isinstance(next_move(run.state, AGENT, run.tick()), AskModel)
    book = call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"})
    run.add(model_answered(run.state, reply_of((book,)), run.now))
    move = next_move(run.state, AGENT, run.tick())
    assert isinstance(move, Append)
    assert [type(e) for e in move.events] == [ToolRejected]
    assert move.events[0].error.code == "unknown_tool"  # type: ignore[union-attr]
    assert not [e for e in move.events if isinstance(e, ActionRequested)]


def test_a_synthetic_run_plans_no_projection_not_even_the_audit_trail() -> None:
    run = Run(msgspec.structs.replace(started(agent="synthetic"), tenant=SYNTHETIC_TENANT))
    assert plan(run.state, 3, AGENT, REGISTRY.tools, T0) == []
    # Another tenant's run of the same agent is audited as every run is; so is the synthetic tenant's booking run
    # (its key may start one): only both marks together keep a run out of the audit log.
    other = Run(msgspec.structs.replace(started(agent="synthetic"), tenant="demo"))
    assert [t.tool for t in plan(other.state, 3, AGENT, REGISTRY.tools, T0)] == ["record_audit"]
    booking = Run(msgspec.structs.replace(started(agent="booking"), tenant=SYNTHETIC_TENANT))
    assert [t.tool for t in plan(booking.state, 3, BOOKING, REGISTRY.tools, T0)] == ["record_audit"]


def test_analytics_count_nothing_for_a_synthetic_runs_search() -> None:
    run = Run(started(agent="synthetic"))
    search = call("search_hotels", {"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-03"})
    run.add(model_answered(run.state, reply_of((search,)), run.tick()))
    move = next_move(run.state, AGENT, run.tick())
    assert isinstance(move, Append)
    run.add(*move.events)
    (request,) = run.state.pending
    run.add(receipt(request, run.tick(), OutcomeStatus.SUCCEEDED, {"hotels": [{"hotel_id": "lis-1"}]}))
    figures = Figures()
    for event in run.events:
        fold(figures, event)
    assert figures.hours == {} and figures.settled == {}


# The judge of a finished turn ---------------------------------------------------------------------------------


def _journal(
    *, tool: str = "search_hotels", status: str = "succeeded", end: str = "run.completed"
) -> list[Any]:
    request = {"type": "run.action_requested", "key": "run_x:2", "tool": tool}
    done = {"type": "run.action_completed", "key": "run_x:2", "status": status, "result": {"hotels": [{}]}}
    ended = {"type": end, "reply": "synthetic: ok: 1 hotel(s) found", "reason": "deadline", "detail": "late"}
    return [{"type": "run.started"}, request, done, ended]


def test_the_judge_passes_a_completed_search_and_names_what_is_wrong_otherwise() -> None:
    assert judge(_journal())[0] == SyntheticResult.OK
    result, why = judge(_journal(tool="create_booking"))
    assert result == SyntheticResult.FAILED and "create_booking" in why
    result, why = judge(_journal(status=OutcomeStatus.FAILED.value))
    assert result == SyntheticResult.FAILED and "search failed" in why
    result, why = judge(_journal(end="run.handed_off"))
    assert result == SyntheticResult.FAILED and why.startswith("handed off: deadline")
    result, why = judge([{"type": "run.started"}, {"type": "run.completed", "reply": "hi"}])
    assert result == SyntheticResult.FAILED and "without a search" in why
    assert judge([{"type": "run.started"}])[0] == SyntheticResult.FAILED


def test_a_turns_result_is_recorded_in_the_metrics_apart_from_process_health() -> None:
    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0

    before = value("crashsafe_synthetic_turns_total", {"result": "slow"})
    seconds = value("crashsafe_synthetic_turn_seconds_count")
    slow = SyntheticTurn(result="slow", reason="no answer", duration_s=30.0, budget_s=30.0, at=T0)
    record(slow)
    assert value("crashsafe_synthetic_turns_total", {"result": "slow"}) == before + 1
    assert value("crashsafe_synthetic_up") == 0.0
    record(msgspec.structs.replace(slow, result="ok", duration_s=0.5))
    assert value("crashsafe_synthetic_up") == 1.0
    assert value("crashsafe_synthetic_turn_seconds_count") == seconds + 2


# Missing policy documents -------------------------------------------------------------------------------------


def test_missing_or_empty_documents_make_an_empty_library_that_says_why(tmp_path: Path) -> None:
    assert Library.stayhub().available
    empty = Library.stayhub(tmp_path)
    assert not empty.available and "no policy documents" in empty.problem
    assert empty.search("What is the cancellation policy?") == []
    gone = Library.stayhub(tmp_path / "nowhere")
    assert not gone.available and "could not be read" in gone.problem
    (tmp_path / "house.md").write_text("# House\n\n## Pets\n\nDogs are welcome in every room.\n")
    mine = Library.stayhub(tmp_path)
    assert mine.available and [s.section for s in mine.sections] == ["Pets"]


@pytest.mark.parametrize(
    ("text", "question"),
    [
        ("What is the cancellation policy?", True),
        ("Can I bring my dog", True),
        ("how late is check-in", True),
        ("Book a room in Lisbon from 2031-12-01 to 2031-12-03", False),
        ("Can you book me a room in Lisbon from 2031-12-01 to 2031-12-03?", False),
        ("refund my payment for booking bk_1", False),
        ("hello", False),
    ],
)
def test_policy_questions_are_told_from_requests(text: str, question: bool) -> None:
    assert policy_question(text) is question


def test_without_documents_a_policy_question_is_handed_off_and_a_request_goes_on() -> None:
    problem = "no policy documents (*.md) at /empty"
    asked = Run(started(text="What is the cancellation policy?"))
    handed = policy_unavailable(asked.state, BOOKING, "What is the cancellation policy?", problem, T0)
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.POLICY_UNAVAILABLE
    assert problem in handed.detail and "won't guess" in handed.reply
    assert len(event_encoder.encode(handed)) < 4096
    # With the documents there, or for a booking request, the model is asked as ever.
    assert policy_unavailable(asked.state, BOOKING, "What is the cancellation policy?", "", T0) is None
    booking = Run(started())
    assert policy_unavailable(booking.state, BOOKING, "Book a room in Lisbon", problem, T0) is None


def test_a_policy_unavailable_hand_off_replays_without_divergence() -> None:
    """The shell decided it from the documents' absence, which the journal does not hold: a replay takes it as
    given (as a failed model call), then finds the run ended with nothing left to do."""
    run = Run(started(text="What is the cancellation policy?"))
    handed = policy_unavailable(
        run.state, BOOKING, "What is the cancellation policy?", "no documents", run.tick()
    )
    assert handed is not None
    run.add(handed)
    assert divergences(run.events, BOOKING, None) == []
