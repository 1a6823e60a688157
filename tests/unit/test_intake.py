"""The intake: what an inbound message, a turn, an outcome, a wake, a timer, a resume or a gone catalog revision
becomes in a run's journal, decided from the folded run alone."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import OutcomeRefused, PoisonMessage
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_decoder, inbound_encoder
from crashsafe.contracts.keys import GuestScope, KeyScheme
from crashsafe.contracts.memory import SessionTurn
from crashsafe.contracts.run_events import (
    MAX_EVENT_BYTES,
    ActionRequested,
    Budget,
    HandOffReason,
    ModelAnswered,
    ModelRejected,
    RunCompleted,
)
from crashsafe.contracts.subjects import WAKE_TOKEN
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, RunWake
from crashsafe.domain import intake
from crashsafe.domain.fold import fold_run
from crashsafe.domain.run_state import RunState
from tests.support.runs import RUN, SEARCH, T0, Run, reply_of, started


def _inbound(
    event_id: str = "evt-2", guest_id: str = "guest-1", text: str = "and breakfast?"
) -> InboundEvent:
    return InboundEvent(
        key=event_id,
        run_id=RUN,
        input_hash="1" * 64,
        message=InboundMessage(event_id=event_id, session_id="sess-1", guest_id=guest_id, text=text),
        agent="booking",
        received_at=T0,
        tenant="acme",
    )


def _searching() -> tuple[Run, ActionRequested]:
    run = Run(started(budget=Budget(deadline_s=300)))
    run.answer(SEARCH)
    (search,) = run.decide()
    assert isinstance(search, ActionRequested)
    return run, search


def _outcome(search: ActionRequested, status: OutcomeStatus = OutcomeStatus.SUCCEEDED) -> ActionOutcome:
    return ActionOutcome(
        run_id=search.run_id,
        step_no=search.step_no,
        tool=search.tool,
        key=search.key,
        status=status,
        result={"hotels": []},
        attempts=2,
        provider_ref="ref-1",
    )


def test_a_message_starts_a_run_pinned_to_the_revision_with_the_budget_of_its_configuration() -> None:
    config = AgentConfig(agent="booking", budget=Budget(deadline_s=60))
    history = [SessionTurn(run_id="run-0", text="earlier", guest_id="guest-1")]
    first = intake.run_started(
        _inbound("evt-1"), T0, revision=7, config=config, profile=None, history=history
    )
    assert (first.run_id, first.event_id, first.idempotency_key, first.tenant) == (
        RUN,
        "evt-1",
        "evt-1",
        "acme",
    )
    assert first.catalog_revision == 7 and first.budget == config.budget
    assert first.deadline_at == T0 + timedelta(seconds=60)
    assert first.history == history
    assert (first.key_scheme, first.guest_scope) == (KeyScheme.BUSINESS, GuestScope.TENANT)
    state = fold_run(None, first)
    assert state is not None and state.run_id == RUN


def test_a_message_that_names_no_agent_is_for_the_deployments_default_agent() -> None:
    named = _inbound()
    assert intake.addressed(named, "steps5") is named  # named: kept, whatever the default
    wire = msgspec.json.decode(inbound_encoder.encode(named))
    del wire["agent"]  # an event without the field reads as naming none
    unnamed = inbound_decoder.decode(msgspec.json.encode(wire))
    assert unnamed.agent == ""
    assert intake.addressed(unnamed, "steps5") == msgspec.structs.replace(named, agent="steps5")


def test_a_turn_is_journaled_once_per_event_id() -> None:
    run, _ = _searching()
    (turn,) = intake.turn(run.state, _inbound(), run.tick())
    assert (turn.run_id, turn.event_id, turn.text) == (RUN, "evt-2", "and breakfast?")
    run.add(turn)
    assert intake.turn(run.state, _inbound(), run.tick()) == ()


def test_an_outcome_is_a_copy_of_the_receipt_journaled_once() -> None:
    run, search = _searching()
    outcome = _outcome(search)
    (done,) = intake.completed(run.state, outcome, run.tick())
    assert (done.step_no, done.key, done.status, done.result, done.attempts, done.provider_ref) == (
        search.step_no,
        search.key,
        OutcomeStatus.SUCCEEDED,
        {"hotels": []},
        2,
        "ref-1",
    )
    run.add(done)
    assert intake.outcome_recorded(run.state, outcome)
    assert intake.completed(run.state, outcome, run.tick()) == ()


def test_an_unknown_outcome_is_settled_later_by_a_known_one_but_not_by_another_unknown() -> None:
    run, search = _searching()
    (unknown,) = intake.completed(run.state, _outcome(search, OutcomeStatus.UNKNOWN), run.tick())
    run.add(unknown)
    assert intake.completed(run.state, _outcome(search, OutcomeStatus.UNKNOWN), run.tick()) == ()
    (settled,) = intake.completed(run.state, _outcome(search), run.tick())
    assert settled.status == OutcomeStatus.SUCCEEDED


def test_an_outcome_on_another_runs_subject_or_posing_as_a_wake_is_refused() -> None:
    _, search = _searching()
    outcome = _outcome(search)
    intake.on_its_subject(outcome, search.family, RUN)
    with pytest.raises(OutcomeRefused):
        intake.on_its_subject(outcome, search.family, "run-other")
    with pytest.raises(OutcomeRefused):
        intake.on_its_subject(outcome, WAKE_TOKEN, RUN)
    wake = RunWake(run_id=RUN, reason="test", at=T0, by="test")
    intake.on_its_subject(wake, WAKE_TOKEN, RUN)
    with pytest.raises(OutcomeRefused):
        intake.on_its_subject(wake, search.family, RUN)


def test_an_active_run_heeds_every_wake_an_ended_one_only_about_what_it_left_open() -> None:
    run, search = _searching()
    wake = RunWake(run_id=RUN, reason="look again", at=T0, by="reconciler", keys=[search.key])
    (nudge,) = intake.nudged(run.state, wake, run.tick())
    assert (nudge.by, nudge.reason, nudge.keys) == ("reconciler", "look again", [search.key])
    run.complete(search.step_no)
    run.add(RunCompleted(run_id=RUN, at=run.tick(), reply="done"))
    assert run.state.terminal
    assert intake.nudged(run.state, wake, run.tick()) == ()
    assert not intake.heeds(run.state, wake)


def test_a_fired_timer_is_a_wake_of_the_run_its_subject_names_or_poison() -> None:
    wake = RunWake(run_id=RUN, reason="approval expired", at=T0, by="timer")
    assert intake.fired(wake, "subject", RUN) is wake
    with pytest.raises(PoisonMessage):
        intake.fired(wake, "subject", None)
    with pytest.raises(PoisonMessage):
        intake.fired(wake, "subject", "run-other")


def test_a_resume_is_journaled_for_an_active_run_only() -> None:
    run, _ = _searching()
    (resumed,) = intake.resumed(run.state, run.tick(), "w2")
    assert (resumed.worker, resumed.next_step, resumed.reason) == ("w2", run.state.next_step, intake.RESUMED)
    ended: RunState = run.add(RunCompleted(run_id=RUN, at=run.tick(), reply="done"))
    assert intake.resumed(ended, run.tick(), "w2") == ()


def test_a_gone_revision_hands_the_run_off_with_its_reason() -> None:
    run, _ = _searching()
    (handed,) = intake.revision_gone(run.state, run.tick(), "revision 3 is gone")
    assert handed.reason == HandOffReason.CATALOG_REVISION_GONE and handed.detail == "revision 3 is gone"
    assert handed.reply


def test_an_answer_over_the_journals_limit_is_refused_as_a_step() -> None:
    run = Run(started())
    small = intake.answer(run.state, reply_of((), "hello", (10, 5)), run.tick())
    assert isinstance(small, ModelAnswered) and small.reply == "hello"
    big = intake.answer(run.state, reply_of((), "x" * (MAX_EVENT_BYTES + 1), (10, 5)), run.tick())
    assert isinstance(big, ModelRejected) and big.answer_bytes > MAX_EVENT_BYTES
