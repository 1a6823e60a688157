"""Business keys: the same intent is the same action across steps, runs and attempts; a new attempt at a failed
charge is the guest's decision; an outcome binds to its own step; replays answer whoever asked."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.capabilities import (
    SIGNED_PREFIX,
    SIGNED_PREFIX_V2,
    Capability,
    CapabilityIssuer,
    CapabilityOrigin,
    CapabilityVerifier,
    OutcomeRefusal,
    Refusal,
    signed_bytes,
)
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.keys import (
    KeyScheme,
    business_key,
    compensation_key,
    key_attempt,
    partition_key,
    partition_of,
    tool_input_hash,
    undone_by,
)
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    Origin,
    PolicyDenied,
    RunStarted,
    ToolRejected,
)
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, OutcomeStatus, RecordStatus, Via
from crashsafe.domain.authority import outcome_refusal
from crashsafe.domain.decide import AskModel, next_move
from crashsafe.domain.execution import Record, Replay, classify
from crashsafe.domain.identity import RETRY_RULE, choose_key, identity_of
from crashsafe.domain.model_calls import model_answered
from crashsafe.domain.policy_verdicts import Allow, Hold
from crashsafe.services.agents import stayhub
from crashsafe.services.agents.booking.booking_tools import CREATE_BOOKING, SEND_CONFIRMATION_EMAIL
from tests.support.runs import BOOK, RUN, Run, call, reply_of, started

HOLD = {"hotel_id": "lis-1", "guest_id": "guest-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}
# The hold as the model asks it: the guest is the server's to name (the tool's schema refuses `guest_id`).
ASKED = {k: v for k, v in HOLD.items() if k != "guest_id"}


def business(first: RunStarted | None = None) -> RunStarted:
    return msgspec.structs.replace(first or started(), key_scheme=KeyScheme.BUSINESS, tenant="acme")


# Keys ---------------------------------------------------------------------------------------------------------


def test_a_business_key_names_the_kind_the_tenant_and_the_identity_and_counts_attempts() -> None:
    first = business_key("hold", "acme", HOLD)
    assert first.startswith("hold:") and len(first) == len("hold:") + 64
    assert business_key("hold", "acme", dict(reversed(HOLD.items()))) == first  # canonical: order-free
    assert business_key("hold", "acme", HOLD, attempt=2) == first + ":a2"
    assert business_key("hold", "other", HOLD) != first  # two tenants' guests never share a key
    assert business_key("charge", "acme", HOLD) != first
    assert business_key("hold", "acme", HOLD | {"check_out": "2031-12-04"}) != first
    assert key_attempt(first) == 1 and key_attempt(first + ":a2") == 2 and key_attempt(f"{RUN}:4") == 1
    assert compensation_key(first + ":a2", "release") == first + ":a2:release"  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        business_key("hold", "acme", HOLD, attempt=0)


def test_every_booking_tool_declares_its_key_rule() -> None:
    registry = stayhub()
    rules = {name: (t.contract.key_rule.value, t.contract.identity) for name, t in registry.tools.items()}
    assert rules == {
        "search_hotels": ("none", ()),
        "find_payments": ("none", ()),
        "create_booking": ("business", ("guest_id", "hotel_id", "check_in", "check_out")),
        "create_payment": ("business", ("booking_id",)),
        "send_confirmation_email": ("business", ("booking_id",)),
        "update_crm": ("business", ("guest_id", "booking_id")),
        "release_booking": ("run_id:step_no", ()),  # compensation-only: keyed from what it undoes
        "refund_payment": ("business", ("payment_id", "amount_cents")),
        # The guest setting a preference, from the profile the run knows: one write (services/agents/remember_preference.py).
        "remember_preference": ("business", ("guest_id", "name", "value", "basis")),
        # The audit trail, a projection only (services/agents/audit_trail.py): keyed by its task, deduplicated
        # by the receiver per event id.
        "record_audit": ("run_id:step_no", ()),
    }
    state = Run(business()).state
    email = identity_of(state, SEND_CONFIRMATION_EMAIL.contract, {"booking_id": "bk_1", "guest_id": "g"})
    assert email == {"booking_id": "bk_1", "template": "booking_confirmation"}
    assert identity_of(state, CREATE_BOOKING.contract, {"hotel_id": "lis-1"}) is None  # never a guess


def test_a_run_journaled_before_business_keys_keeps_its_step_keys() -> None:
    run = Run(started())  # key_scheme "" (an old journal)
    run.answer(BOOK)
    (request,) = run.decide()
    assert isinstance(request, ActionRequested) and request.key == f"{RUN}:{request.step_no}"


# The same intent is the same action ---------------------------------------------------------------------------


def test_the_same_room_asked_in_two_answers_is_one_key_and_one_release() -> None:
    run = Run(business())
    run.answer(BOOK)
    (first,) = run.decide()
    run.complete(first.step_no)
    run.answer(call("create_booking", ASKED, "call_book_again"))
    (second,) = run.decide()
    assert isinstance(first, ActionRequested) and isinstance(second, ActionRequested)
    assert first.key == second.key == business_key("hold", "acme", HOLD)
    assert second.step_no != first.step_no  # its own step: its own outcome
    run.complete(second.step_no)
    # At the end the hold (one effect, two steps) is released once.
    run.answer(text="done")
    releases = [e for e in run.decide() if isinstance(e, ActionRequested) and e.origin == Origin.COMPENSATION]
    assert [r.key for r in releases] == [compensation_key(first.key, "release")]  # type: ignore[arg-type]


def test_a_released_hold_asked_again_is_a_new_attempt() -> None:
    run = Run(business())
    run.answer(BOOK)
    (hold,) = run.decide()
    done = run.complete(hold.step_no)
    run.answer(call("create_payment", {"booking_id": done.result["booking_id"]}))
    (pay,) = run.decide()
    run.complete(pay.step_no, status="failed")
    (release,) = run.decide()  # the declined charge's hold is given back
    assert isinstance(release, ActionRequested) and release.key == f"{hold.key}:release"
    run.complete(release.step_no)
    run.answer(call("create_booking", ASKED, "call_book_again"))
    (again,) = run.decide()
    assert isinstance(again, ActionRequested) and again.key == hold.key + ":a2"


# A failed charge is retried only with the guest's approval ---------------------------------------------------


def test_paying_again_after_a_decline_is_denied_once_its_hold_is_released_and_a_new_hold_is_a_new_charge() -> (
    None
):
    """The booking agent releases a declined charge's hold at once, and the policy never pays a released
    booking (`undone_effect`, slice P): the guest's way forward is a new hold, charged under its own key.
    The retry-with-approval rule is pinned on the key choice below."""
    run = Run(business())
    run.answer(BOOK)
    (hold,) = run.decide()
    booking_id = run.complete(hold.step_no).result["booking_id"]
    pay_call = call("create_payment", {"booking_id": booking_id}, "call_pay")
    run.answer(pay_call)
    (pay,) = run.decide()
    assert isinstance(pay, ActionRequested) and pay.key == business_key(
        "charge", "acme", {"booking_id": booking_id}
    )
    run.complete(pay.step_no, status="failed")
    run.decide()  # the release of the hold (booking agent's rule); leave it pending: the model is not asked yet
    (release,) = run.state.pending
    run.complete(release.step_no)
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay_again"))
    (denied,) = run.decide()
    assert isinstance(denied, PolicyDenied) and denied.rule == "undone_effect"
    assert run.state.pending == ()  # no second charge is requested
    run.answer(call("create_booking", ASKED, "call_book_again"))
    (again,) = run.decide()
    assert isinstance(again, ActionRequested) and again.key == hold.key + ":a2"
    new_booking = run.complete(again.step_no).result["booking_id"]
    run.answer(call("create_payment", {"booking_id": new_booking}, "call_pay_new"))
    (charge,) = run.decide()
    assert isinstance(charge, ActionRequested)
    assert charge.key == business_key("charge", "acme", {"booking_id": new_booking}) != pay.key


def test_without_approval_the_model_asking_again_never_gets_a_new_charge_key() -> None:
    run = Run(business())
    run.answer(BOOK)
    (hold,) = run.decide()
    booking_id = run.complete(hold.step_no).result["booking_id"]
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (pay,) = run.decide()
    run.complete(pay.step_no, status="failed")
    args = {
        "booking_id": booking_id,
        "guest_id": "guest-1",
        "amount_cents": pay.args["amount_cents"],
        "currency": "EUR",
    }
    hashed = tool_input_hash("create_payment", args)
    contract = stayhub().tools["create_payment"].contract
    keyed = choose_key(run.state, contract, args, hashed, f"{RUN}:99")
    assert keyed.key == pay.key and isinstance(keyed.verdict, Hold)
    assert (keyed.verdict.rule, keyed.verdict.approver) == (RETRY_RULE, "guest")


def test_a_tool_without_business_identity_keeps_the_step_key() -> None:
    run = Run(business())
    contract = stayhub().tools["release_booking"].contract
    keyed = choose_key(run.state, contract, {"booking_id": "bk_1"}, "0" * 64, f"{RUN}:7")
    assert keyed.key == f"{RUN}:7" and isinstance(keyed.verdict, Allow)


# Outcomes bind by key and step; replays answer the asker -----------------------------------------------------


def _outcome(request: ActionRequested, step_no: int | None = None) -> ActionOutcome:
    return ActionOutcome(
        run_id=RUN,
        step_no=request.step_no if step_no is None else step_no,
        tool=request.tool,
        key=request.key,
        status=OutcomeStatus.SUCCEEDED,
    )


def test_an_outcome_binds_to_its_own_step_when_two_steps_share_a_key() -> None:
    run = Run(business())
    run.answer(BOOK, call("create_booking", ASKED, "call_twice"))
    first, second = run.decide()
    assert isinstance(first, ActionRequested) and isinstance(second, ActionRequested)
    assert first.key == second.key
    assert outcome_refusal(run.state, _outcome(first), "booking") is None
    assert outcome_refusal(run.state, _outcome(second), "booking") is None
    assert outcome_refusal(run.state, _outcome(first, step_no=99), "booking") == OutcomeRefusal.WRONG_STEP


def _request(run_id: str, step_no: int, key: str) -> ActionRequest:
    return ActionRequest(
        run_id=run_id,
        step_no=step_no,
        tool="create_booking",
        family="booking",
        args=HOLD,
        key=key,
        input_hash=tool_input_hash("create_booking", HOLD),
        timeout_s=5.0,
        deadline_at=started().at + timedelta(seconds=5),
        requested_at=started().at,
    )


def test_a_replay_answers_the_run_and_step_that_asked_and_names_who_made_it() -> None:
    key = business_key("hold", "acme", HOLD)
    first = _request(RUN, 3, key)
    stored = ActionOutcome(
        run_id=RUN,
        step_no=3,
        tool="create_booking",
        key=key,
        status=OutcomeStatus.SUCCEEDED,
        result={"booking_id": "bk_1"},
    )
    record = Record(
        key=key, input_hash=first.input_hash, status=RecordStatus.SUCCEEDED, attempts=1, outcome=stored
    )
    later = "run_" + "f" * 24
    plan = classify(record, _request(later, 2, key), deliveries=1)
    assert isinstance(plan, Replay)
    answer = plan.outcome
    assert (answer.run_id, answer.step_no, answer.result, answer.via) == (
        later,
        2,
        {"booking_id": "bk_1"},
        Via.REPLAY,
    )
    assert f"first made for {RUN} step 3" in answer.evidence[-1].detail


# Capabilities bound to the run's agent ------------------------------------------------------------------------


def test_a_compensation_only_tool_is_served_to_a_plan_only_under_the_agent_whose_model_may_ask() -> None:
    key = Ed25519PrivateKey.generate()
    issuer = CapabilityIssuer(key)
    verifier = CapabilityVerifier([key.public_key()], {"refund_payment"}, stayhub().model_tools)
    args = {"payment_id": "pay_1", "amount_cents": 100}
    refund = ActionRequest(
        run_id=RUN,
        step_no=4,
        tool="refund_payment",
        family="payment",
        args=args,
        key=business_key("refund", "acme", args),
        input_hash=tool_input_hash("refund_payment", args),
        timeout_s=10.0,
        deadline_at=started().at + timedelta(seconds=10),
        requested_at=started().at,
    )
    now, until = started().at, started().at + timedelta(seconds=60)
    assert verifier.check(issuer.grant(refund, CapabilityOrigin.PLAN, until, agent="support"), now) is None
    for agent in ("booking", "", "nobody"):
        granted = issuer.grant(refund, CapabilityOrigin.PLAN, until, agent=agent)
        assert verifier.check(granted, now) == Refusal.WRONG_ORIGIN
    # The agent is signed: a booking run's capability relabelled as support's does not verify.
    booking = issuer.grant(refund, CapabilityOrigin.PLAN, until, agent="booking")
    assert booking.capability is not None
    relabelled = msgspec.structs.replace(
        booking, capability=msgspec.structs.replace(booking.capability, agent="support")
    )
    assert verifier.check(relabelled, now) == Refusal.BAD_SIGNATURE
    # A compensation capability still serves the booking agent's refund, whatever the agent.
    assert (
        verifier.check(issuer.grant(refund, CapabilityOrigin.COMPENSATION, until, agent="booking"), now)
        is None
    )


def _support_run() -> Run:
    run = Run(business(started(agent="support", text="please refund my 1,840 EUR loyalty refund")))
    return run


def _manager_approves(run: Run, held: object) -> tuple[object, ...]:
    """A refund above the support agent's `refund_within_paid` limit (150.00) waits for a manager (slice P)."""
    assert isinstance(held, ApprovalRequested) and held.approver == "manager", held
    run.add(
        ApprovalDecided(
            run_id=RUN,
            at=run.tick(),
            approval_id=held.approval_id,
            decision=ApprovalStatus.APPROVED,
            decided_by="manager:m-1",
            input_hash=held.input_hash,
        )
    )
    return run.decide(stayhub().agent("support"))


def _ask(run: Run, *calls: object) -> tuple[object, ...]:
    support = stayhub().agent("support")
    move = next_move(run.state, support, run.tick())
    assert isinstance(move, AskModel), move
    run.add(model_answered(run.state, reply_of(tuple(calls)), run.now))  # type: ignore[arg-type]
    return run.decide(support)


PAID = {
    "payment_id": "pay_1",
    "booking_id": "bk_1",
    "guest_id": "guest-1",
    "amount_cents": 184_000,
    "currency": "EUR",
    "status": "captured",
    "refunded_cents": 4_000,
}


def test_support_refunds_only_a_payment_found_for_its_guest_and_never_above_what_is_left() -> None:
    run = _support_run()
    (rejected,) = _ask(run, call("refund_payment", {"payment_id": "pay_1"}))
    assert (
        isinstance(rejected, ToolRejected) and rejected.error.code == "unknown_payment"
    )  # not looked up yet
    (named,) = _ask(run, call("find_payments", {"guest_id": "someone-else"}))
    # The model may not name whose payments: the schema has no such field, so the call is refused as malformed.
    assert isinstance(named, ToolRejected) and named.error.details["field"] == "guest_id"
    (find,) = _ask(run, call("find_payments", {}))
    assert isinstance(find, ActionRequested) and find.args == {"guest_id": "guest-1"}  # the run's guest only
    stranger = PAID | {"payment_id": "pay_2", "guest_id": "someone-else"}
    run.complete(find.step_no, result={"payments": [PAID, stranger]})
    (other,) = _ask(run, call("refund_payment", {"payment_id": "pay_2"}))
    assert isinstance(other, ToolRejected) and other.error.code == "unknown_payment"
    (over,) = _ask(run, call("refund_payment", {"payment_id": "pay_1", "amount_cents": 180_001}))
    # Above what is left: the policy's denial (`refund_within_paid`, slice P), before the agent prepares it.
    assert isinstance(over, PolicyDenied) and over.rule == "refund_within_paid"
    assert "1,800.00 EUR left" in over.reason
    (held,) = _ask(run, call("refund_payment", {"payment_id": "pay_1", "amount_cents": 180_000}))
    (refund,) = _manager_approves(run, held)
    assert isinstance(refund, ActionRequested)
    assert refund.args == {
        "payment_id": "pay_1",
        "amount_cents": 180_000,
        "currency": "EUR",
        "booking_id": "bk_1",
        "guest_id": "guest-1",
    }
    assert refund.key == business_key("refund", "acme", {"payment_id": "pay_1", "amount_cents": 180_000})
    assert refund.origin == Origin.MODEL


# Undone effects are never replayed as if they stood --------------------------------------------------------


def test_a_business_keys_compensation_shares_its_partition_and_step_keys_keep_theirs() -> None:
    hold = business_key("hold", "acme", HOLD)
    assert undone_by(f"{hold}:release") == hold and undone_by(hold) is None
    assert partition_key(f"{hold}:release") == hold and partition_key(f"{hold}:a2:release") == f"{hold}:a2"
    assert all(partition_of(f"{hold}:release", n) == partition_of(hold, n) for n in (1, 7, 16, 64))
    step = f"{RUN}:4"
    assert partition_key(f"{step}:release") == f"{step}:release"  # unchanged: journals from before


def _stored(key: str, run_id: str = RUN, step_no: int = 3) -> Record:
    outcome = ActionOutcome(
        run_id=run_id,
        step_no=step_no,
        tool="create_booking",
        key=key,
        status=OutcomeStatus.SUCCEEDED,
        result={"booking_id": "bk_1", "status": "held"},
    )
    return Record(
        key=key,
        input_hash=tool_input_hash("create_booking", HOLD),
        status=RecordStatus.SUCCEEDED,
        attempts=1,
        outcome=outcome,
    )


def test_a_replay_of_a_released_hold_to_another_run_is_action_undone_not_the_stale_receipt() -> None:
    key = business_key("hold", "acme", HOLD)
    release = Record(
        key=f"{key}:release", input_hash="0" * 64, status=RecordStatus.SUCCEEDED, attempts=1, outcome=None
    )
    later = "run_" + "e" * 24
    plan = classify(_stored(key), _request(later, 2, key), deliveries=1, undone=release)
    assert isinstance(plan, Replay)
    answer = plan.outcome
    assert (answer.run_id, answer.step_no, answer.status) == (later, 2, OutcomeStatus.FAILED)
    assert answer.error is not None and answer.error.code == "action_undone" and answer.result == {}
    # The run that made it still hears its own receipt on a redelivery; a release still in flight undoes nothing.
    own = classify(_stored(key), _request(RUN, 3, key), deliveries=2, undone=release)
    assert isinstance(own, Replay) and own.outcome.status == OutcomeStatus.SUCCEEDED
    open_release = dataclasses.replace(release, status=RecordStatus.STARTED)
    pending = classify(_stored(key), _request(later, 2, key), deliveries=1, undone=open_release)
    assert isinstance(pending, Replay) and pending.outcome.status == OutcomeStatus.SUCCEEDED


def test_after_an_action_undone_answer_the_next_ask_is_the_next_attempt() -> None:
    run = Run(business())
    run.answer(BOOK)
    (hold,) = run.decide()
    assert isinstance(hold, ActionRequested)
    request = run.state.pending_step(hold.step_no)
    assert request is not None
    run.add(
        ActionCompleted(
            run_id=RUN,
            at=run.tick(),
            step_no=hold.step_no,
            key=hold.key,
            status=OutcomeStatus.FAILED,
            error=ErrorInfo(code="action_undone", message="released by another run"),
            via=Via.REPLAY,
        )
    )
    run.answer(call("create_booking", ASKED, "call_book_again"))
    (again,) = run.decide()
    assert isinstance(again, ActionRequested) and again.key == hold.key + ":a2"


def test_a_capability_bound_to_an_agent_signs_the_v2_layout_and_an_unbound_one_the_v1_bytes() -> None:
    """Pinned byte for byte, as the v1 layout is (tests/unit/test_capabilities.py)."""
    unbound = Capability(
        run_id=RUN,
        key="charge:" + "b" * 64,
        tool="refund_payment",
        family="payment",
        input_hash="a" * 64,
        origin="plan",
        expires_at=datetime(2026, 12, 1, 9, 31, 45, 123456, tzinfo=UTC),
        kid="0123456789abcdef",
        sig="ignored",
    )
    fields = (
        b'["run_0123456789abcdef01234567","charge:' + b"b" * 64 + b'","refund_payment","payment",'
        b'"' + b"a" * 64 + b'","plan",1796117505123456,"0123456789abcdef"'
    )
    assert signed_bytes(unbound) == SIGNED_PREFIX + fields + b"]"
    bound = msgspec.structs.replace(unbound, agent="support")
    assert signed_bytes(bound) == SIGNED_PREFIX_V2 + fields + b',"support"]'
    assert SIGNED_PREFIX_V2 == b"crashsafe.capability.v2\x00"


def test_support_counts_the_refunds_it_asked_for_since_its_last_look() -> None:
    run = _support_run()
    (find,) = _ask(run, call("find_payments", {}))
    run.complete(find.step_no, result={"payments": [PAID]})  # 180,000 left
    (held,) = _ask(run, call("refund_payment", {"payment_id": "pay_1", "amount_cents": 100_000}))
    (first,) = _manager_approves(run, held)
    assert isinstance(first, ActionRequested)
    run.complete(first.step_no, result={"refund_id": "re_1", "status": "succeeded"})
    (over,) = _ask(run, call("refund_payment", {"payment_id": "pay_1", "amount_cents": 80_001}))
    assert isinstance(over, PolicyDenied) and over.rule == "refund_within_paid"
    assert "800.00 EUR left" in over.reason
    (held,) = _ask(run, call("refund_payment", {"payment_id": "pay_1"}))  # no amount: what is left
    (rest,) = _manager_approves(run, held)
    assert isinstance(rest, ActionRequested) and rest.args["amount_cents"] == 80_000


# Undoing an effect another run made ---------------------------------------------------------------------------


@pytest.mark.parametrize(("maker", "released"), [(RUN, True), ("run_" + "e" * 24, False)])
def test_an_unpaid_hold_is_released_only_by_the_run_that_made_it(maker: str, released: bool) -> None:
    """A run ending unpaid releases its hold, also when its receipt came back as the store's replay (its first
    answer was lost); a hold the store handed over from another run's receipt is that run's, and is kept."""
    from crashsafe.contracts.tool_messages import Answer, Asked, Evidence
    from tests.support.runs import receipt

    run = Run(started())
    run.answer(BOOK)
    (request,) = run.decide()
    assert isinstance(request, ActionRequested)
    done = receipt(request, run.tick())
    line = Evidence(
        asked=Asked.STORE_RECEIPT,
        key=request.key,
        answer=Answer.REPLAYED,
        detail=f"first made for {maker} step 2",
        at=run.now,
    )
    run.add(msgspec.structs.replace(done, via=Via.REPLAY, evidence=[line]))
    run.answer(text="Your room is held.")
    tools = [e.tool for e in run.decide() if isinstance(e, ActionRequested)]
    assert tools == (["release_booking"] if released else [])
