"""Properties over random journals (hypothesis): any run the core can produce folds, numbers its steps
contiguously, replays to the same decisions, and never moves money for a booking it did not make."""

from __future__ import annotations

import json

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, Budget, RunResumed, ToolCall
from crashsafe.domain.fold import fold_run, replay
from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.run_state import RunState
from tests.support.journals import DECISIONS, decision_steps
from tests.support.runs import BOOK, RUN, SEARCH, Run, assert_replays, booking_model, drive, reply_of, started

# Hypothesis writes no example database into the repository, and a busy 2-core machine must not trip deadlines.
PROPERTY = settings(
    max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

CANDIDATE_CALLS = [
    ("search_hotels", lambda s: SEARCH.arguments),
    ("search_hotels", lambda s: '{"city": "Lisbon"}'),
    ("create_booking", lambda s: BOOK.arguments),
    (
        "create_booking",
        lambda s: '{"hotel_id": "lis-1", "check_in": "2031-12-05", "check_out": "2031-12-01"}',
    ),
    ("create_payment", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("create_payment", lambda s: json.dumps({"booking_id": _latest_booking(s), "amount_cents": 5})),
    ("create_payment", lambda s: '{"booking_id": "bk_unknown"}'),
    ("send_confirmation_email", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("update_crm", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("drop_database", lambda s: "{}"),
    ("create_booking", lambda s: "{oops"),
    ("update_crm", lambda s: '"just a string"'),
]


def _latest_booking(state: RunState) -> str:
    results = state.succeeded_results("create_booking")
    return str(results[-1]["booking_id"]) if results else "bk_none_yet"


def random_run(data: st.DataObject) -> Run:
    budget = Budget(
        max_steps=data.draw(st.integers(2, 20), label="max_steps"),
        max_tokens=data.draw(st.sampled_from([300, 2_000, 60_000, 60_000]), label="max_tokens"),
        deadline_s=data.draw(st.sampled_from([20.0, 90.0, 600.0]), label="deadline_s"),
    )
    agent = data.draw(st.sampled_from(["booking", "booking", "steps5"]), label="agent")
    counter = iter(range(10_000))

    def model(state: RunState) -> ModelReply:
        tokens = (data.draw(st.integers(1, 200)), data.draw(st.integers(1, 40)))
        kind = data.draw(
            st.sampled_from(["text", "sensible", "sensible", "sensible", "random", "random"]), label="model"
        )
        if kind == "text":
            return reply_of(text=data.draw(st.sampled_from(["Done.", "Which dates?"])), tokens=tokens)
        if kind == "sensible":
            sensible = booking_model(state)
            return reply_of(
                tuple(
                    msgspec.structs.replace(c, call_id=f"call_{next(counter)}") for c in sensible.tool_calls
                ),
                sensible.reply,
                tokens,
            )
        picks = data.draw(
            st.lists(st.sampled_from(range(len(CANDIDATE_CALLS))), min_size=1, max_size=3), label="calls"
        )
        calls = tuple(
            ToolCall(
                call_id=f"call_{next(counter)}",
                name=CANDIDATE_CALLS[p][0],
                arguments=CANDIDATE_CALLS[p][1](state),
            )
            for p in picks
        )
        return reply_of(calls, tokens=tokens)

    def outcome(request: ActionRequested) -> str:
        return data.draw(
            st.sampled_from(["succeeded"] * 10 + ["failed", "unknown"]), label=f"outcome {request.tool}"
        )

    def extra(run: Run) -> None:
        # Redeliveries and restarts journal more events; none of them may change a decision.
        last = run.events[-1]
        if isinstance(last, ActionCompleted) and data.draw(st.integers(0, 4)) == 0:
            run.add(msgspec.structs.replace(last, at=run.tick(), deliveries=2))
        if not run.state.terminal and data.draw(st.integers(0, 6)) == 0:
            run.add(
                RunResumed(
                    run_id=RUN, at=run.tick(), worker="w2", next_step=run.state.next_step, reason="restart"
                )
            )

    return drive(
        started(agent=agent, budget=budget),
        model,
        outcome,
        pick=lambda n: data.draw(st.integers(0, n - 1)),
        gap=lambda: data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 3.0, 15.0])),
        extra=extra,
    )


@PROPERTY
@given(st.data())
def test_property_every_prefix_folds_and_steps_stay_contiguous(data: st.DataObject) -> None:
    run = random_run(data)
    assert run.state.terminal  # every run ends: completes or is handed to a person
    for cut in range(len(run.events) + 1):
        replay(run.events[:cut])  # never raises
    steps = decision_steps(run.events)
    assert steps == list(range(1, len(steps) + 1))
    requested = [e.step_no for e in run.events if isinstance(e, ActionRequested)]
    assert len(requested) == len(set(requested))
    keys = [e.key for e in run.events if isinstance(e, ActionRequested)]
    assert len(keys) == len(set(keys))  # one key, one intent: never two effects for one key
    # Only compensations may go past the step budget: undoing an effect is never starved.
    for event in run.events:
        if (
            isinstance(event, DECISIONS)
            and getattr(event, "origin", "model") != "compensation"
            and not getattr(event, "call_id", "").startswith("comp:")
        ):
            assert event.step_no <= run.state.budget.max_steps


@PROPERTY
@given(st.data())
def test_property_replay_equals_incremental_fold(data: st.DataObject) -> None:
    run = random_run(data)
    assert replay(run.events) == run.state
    state = None
    for i, event in enumerate(run.events):
        state = fold_run(state, event)
        assert state == replay(run.events[: i + 1])


@PROPERTY
@given(st.data())
def test_property_replaying_a_journal_gives_the_same_decisions(data: st.DataObject) -> None:
    run = random_run(data)
    assert_replays(run.events)


@PROPERTY
@given(st.data())
def test_property_money_moves_only_for_a_booking_made_in_the_run(data: st.DataObject) -> None:
    run = random_run(data)
    booked = {}
    for event in run.events:
        if (
            isinstance(event, ActionCompleted)
            and event.status == "succeeded"
            and "booking_id" in event.result
            and "nights" in event.result
        ):
            booked[event.result["booking_id"]] = event.result["total_cents"]
        if isinstance(event, ActionRequested) and event.tool == "create_payment":
            assert booked.get(event.args["booking_id"]) == event.args["amount_cents"]
