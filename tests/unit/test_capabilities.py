"""Run-scoped capabilities, pure: every refusal reason, key ids, rotation, the signed bytes, and the runtime's
rules for what it signs and which outcomes it journals."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from crashsafe.contracts.capabilities import (
    GRACE_S,
    SIGNED_PREFIX,
    Capability,
    CapabilityIssuer,
    CapabilityOrigin,
    CapabilityVerifier,
    OutcomeRefusal,
    Refusal,
    key_id,
    signed_bytes,
)
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.keys import CompensationKind, action_key, compensation_key, tool_input_hash
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    Origin,
    RunEvent,
    RunStarted,
)
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    action_request_decoder,
    tool_encoder,
)
from crashsafe.domain.authority import outcome_refusal, resend_terms, terms_for, to_resolve
from crashsafe.domain.fold import replay
from crashsafe.domain.run_state import RunState

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
RUN = "run_94cb296d1a30794270b8b64f"
RUNTIME_KEY = Ed25519PrivateKey.generate()
ISSUER = CapabilityIssuer(RUNTIME_KEY)
VERIFIER = CapabilityVerifier([RUNTIME_KEY.public_key()], compensation_tools={"refund_payment"})
PAY_ARGS = {"booking_id": "bk_1", "guest_id": "g1", "amount_cents": 24000, "currency": "EUR"}


def request(
    tool: str = "create_payment", args: dict[str, object] | None = None, key: str = ""
) -> ActionRequest:
    args = dict(PAY_ARGS if args is None else args)
    return ActionRequest(
        run_id=RUN,
        step_no=6,
        tool=tool,
        family="payment",
        args=args,
        key=key or action_key(RUN, 6),
        input_hash=tool_input_hash(tool, args),
        timeout_s=10.0,
        deadline_at=NOW + timedelta(seconds=10),
        requested_at=NOW,
    )


def granted(
    req: ActionRequest | None = None,
    origin: CapabilityOrigin = CapabilityOrigin.PLAN,
    expires_at: datetime | None = None,
    issuer: CapabilityIssuer = ISSUER,
) -> ActionRequest:
    req = req or request()
    return issuer.grant(req, origin, expires_at or req.deadline_at + timedelta(seconds=GRACE_S))


def test_a_capability_the_runtime_signed_for_exactly_this_request_passes() -> None:
    assert VERIFIER.check(granted(), NOW) is None
    assert VERIFIER.check(granted(), NOW + timedelta(seconds=69)) is None  # deadline 10 s + grace 60 s


def test_no_capability_is_missing() -> None:
    assert VERIFIER.check(request(), NOW) == Refusal.MISSING


def test_a_capability_from_a_key_the_executor_does_not_hold_is_unknown_key() -> None:
    forger = CapabilityIssuer(Ed25519PrivateKey.generate())
    assert VERIFIER.check(granted(issuer=forger), NOW) == Refusal.UNKNOWN_KEY


def test_a_forged_signature_under_the_runtimes_key_id_is_bad_signature() -> None:
    forger = CapabilityIssuer(Ed25519PrivateKey.generate())
    forged = granted(issuer=forger)
    assert forged.capability is not None
    posing = msgspec.structs.replace(forged.capability, kid=ISSUER.kid)  # claims the runtime's key
    assert VERIFIER.check(msgspec.structs.replace(forged, capability=posing), NOW) == Refusal.BAD_SIGNATURE
    for sig in ("", "not base64!", "A" * 86):
        good = granted()
        assert good.capability is not None
        cap = msgspec.structs.replace(good.capability, sig=sig)
        assert VERIFIER.check(msgspec.structs.replace(good, capability=cap), NOW) == Refusal.BAD_SIGNATURE


@pytest.mark.parametrize(
    "field",
    ["run_id", "key", "tool", "family", "input_hash", "origin", "expires_at", "kid"],
)
def test_any_signed_field_changed_inside_the_capability_breaks_the_signature(field: str) -> None:
    good = granted()
    assert good.capability is not None
    changed: object = (
        NOW + timedelta(days=1) if field == "expires_at" else "x" + str(getattr(good.capability, field))
    )
    # Another kid is another key, which this executor does not hold.
    expected = Refusal.UNKNOWN_KEY if field == "kid" else Refusal.BAD_SIGNATURE
    cap = msgspec.structs.replace(good.capability, **{field: changed})
    assert VERIFIER.check(msgspec.structs.replace(good, capability=cap), NOW) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "run_000000000000000000000000"),
        ("key", f"{RUN}:7"),
        ("tool", "refund_payment"),
        ("family", "booking"),
        ("input_hash", "0" * 64),
    ],
)
def test_a_valid_capability_on_a_request_for_something_else_is_altered(field: str, value: str) -> None:
    altered = msgspec.structs.replace(granted(), **{field: value})
    assert VERIFIER.check(altered, NOW) == Refusal.ALTERED


def test_a_valid_capability_with_swapped_args_is_input_mismatch() -> None:
    """The request's own input_hash is untouched: the executor recomputes it from tool and args."""
    good = granted()
    for args in ({**PAY_ARGS, "amount_cents": 1}, {**PAY_ARGS, "booking_id": "bk_other"}, {}):
        assert VERIFIER.check(msgspec.structs.replace(good, args=args), NOW) == Refusal.INPUT_MISMATCH


def test_past_its_expiry_a_capability_is_expired() -> None:
    good = granted(expires_at=NOW + timedelta(seconds=5))
    assert VERIFIER.check(good, NOW + timedelta(seconds=4, microseconds=999_999)) is None
    assert VERIFIER.check(good, NOW + timedelta(seconds=5)) == Refusal.EXPIRED


def test_compensation_tools_take_only_compensation_capabilities_and_those_fit_nothing_else() -> None:
    refund_args = {"payment_id": "pay_1"}
    refund = request(
        "refund_payment", refund_args, key=compensation_key(action_key(RUN, 6), CompensationKind.REFUND)
    )
    assert VERIFIER.check(granted(refund, CapabilityOrigin.PLAN), NOW) == Refusal.WRONG_ORIGIN
    assert VERIFIER.check(granted(refund, CapabilityOrigin.COMPENSATION), NOW) is None
    assert VERIFIER.check(granted(request(), CapabilityOrigin.COMPENSATION), NOW) == Refusal.WRONG_ORIGIN
    # `resolve` (no longer signed: a re-send keeps its request's origin) is never a pass to a compensation tool.
    assert VERIFIER.check(granted(refund, CapabilityOrigin.RESOLVE), NOW) == Refusal.WRONG_ORIGIN
    assert VERIFIER.check(granted(request(), CapabilityOrigin.RESOLVE), NOW) is None


def test_an_origin_this_version_does_not_know_is_refused() -> None:
    good = granted()
    assert good.capability is not None
    unsigned = msgspec.structs.replace(good.capability, origin="superuser", sig="")
    resigned = msgspec.structs.replace(unsigned, sig=_b64(RUNTIME_KEY.sign(signed_bytes(unsigned))))
    assert VERIFIER.check(msgspec.structs.replace(good, capability=resigned), NOW) == Refusal.WRONG_ORIGIN


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_two_verification_keys_are_accepted_during_a_rotation() -> None:
    new_key = Ed25519PrivateKey.generate()
    rotating = CapabilityVerifier([RUNTIME_KEY.public_key(), new_key.public_key()], ())
    after = CapabilityVerifier([new_key.public_key()], ())
    old_signed, new_signed = granted(), granted(issuer=CapabilityIssuer(new_key))
    assert rotating.check(old_signed, NOW) is None and rotating.check(new_signed, NOW) is None
    assert after.check(new_signed, NOW) is None
    assert after.check(old_signed, NOW) == Refusal.UNKNOWN_KEY
    with pytest.raises(ValueError):
        CapabilityVerifier([], ())


def test_the_key_id_is_the_first_16_hex_of_sha256_of_the_raw_public_key() -> None:
    raw = RUNTIME_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert key_id(RUNTIME_KEY.public_key()) == hashlib.sha256(raw).hexdigest()[:16] == ISSUER.kid
    assert ISSUER.kid in repr(ISSUER) and "PRIVATE" not in repr(ISSUER)


def test_the_signed_bytes_are_versioned_and_fixed() -> None:
    """Pinned byte for byte: an executor in another language must build the same bytes."""
    cap = Capability(
        run_id=RUN,
        key=f"{RUN}:6",
        tool="create_payment",
        family="payment",
        input_hash="a" * 64,
        origin="plan",
        expires_at=datetime(2026, 12, 1, 9, 31, 45, 123456, tzinfo=UTC),
        kid="0123456789abcdef",
        sig="ignored",
    )
    assert signed_bytes(cap) == SIGNED_PREFIX + (
        b'["run_94cb296d1a30794270b8b64f","run_94cb296d1a30794270b8b64f:6","create_payment","payment",'
        b'"' + b"a" * 64 + b'","plan",1796117505123456,"0123456789abcdef"]'
    )
    assert SIGNED_PREFIX == b"crashsafe.capability.v1\x00"
    # The same instant in another time zone signs the same bytes.
    elsewhere = msgspec.structs.replace(
        cap, expires_at=cap.expires_at.astimezone(timezone(timedelta(hours=2)))
    )
    assert signed_bytes(elsewhere) == signed_bytes(cap)
    with pytest.raises(ValueError):
        signed_bytes(msgspec.structs.replace(cap, expires_at=cap.expires_at.replace(tzinfo=None)))


def test_a_capability_survives_the_wire() -> None:
    sent = granted()
    assert VERIFIER.check(action_request_decoder.decode(tool_encoder.encode(sent)), NOW) is None


# What the runtime signs -------------------------------------------------------------------------------------


def _intent(origin: Origin = Origin.MODEL, step: int = 6, tool: str = "create_payment") -> ActionRequested:
    args = dict(PAY_ARGS)
    return ActionRequested(
        run_id=RUN,
        at=NOW,
        step_no=step,
        call_id=f"call_{step}",
        tool=tool,
        family="payment",
        args=args,
        key=action_key(RUN, step),
        input_hash=tool_input_hash(tool, args),
        timeout_s=10.0,
        deadline_at=NOW + timedelta(seconds=10),
        origin=origin,
    )


def test_a_plan_step_is_signed_plan_and_a_compensation_compensation_until_its_deadline_plus_grace() -> None:
    until = NOW + timedelta(seconds=10 + GRACE_S)
    assert terms_for(_intent(Origin.MODEL), NOW) == (t := terms_for(_intent(Origin.PLAN), NOW))
    assert (t.origin, t.expires_at) == (CapabilityOrigin.PLAN, until)
    comp = terms_for(_intent(Origin.COMPENSATION), NOW)
    assert (comp.origin, comp.expires_at) == (CapabilityOrigin.COMPENSATION, until)
    # Re-published after that (a runtime resuming the run much later): its own origin, with a fresh expiry.
    late = terms_for(_intent(), until)
    assert (late.origin, late.expires_at) == (CapabilityOrigin.PLAN, until + timedelta(seconds=GRACE_S))
    late_comp = terms_for(_intent(Origin.COMPENSATION), until)
    assert late_comp.origin == CapabilityOrigin.COMPENSATION
    # A wake's re-send too: a plan's request for a compensation-only tool stays a plan's, and is refused.
    assert resend_terms(_intent(Origin.MODEL), until).origin == CapabilityOrigin.PLAN


def _run(*events: RunEvent) -> RunState:
    started = RunStarted(
        run_id=RUN,
        at=NOW,
        agent="booking",
        session_id="s",
        guest_id="g1",
        event_id="e",
        idempotency_key="e",
        input_hash="f" * 64,
        text="book",
        budget=Budget(),
        deadline_at=NOW + timedelta(seconds=90),
    )
    state = replay([started, *events])
    assert state is not None
    return state


def _outcome(step: int = 6, tool: str = "create_payment", key: str = "", run_id: str = RUN) -> ActionOutcome:
    return ActionOutcome(
        run_id=run_id,
        step_no=step,
        tool=tool,
        key=key or action_key(RUN, step),
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_1"},
    )


def test_an_outcome_is_journaled_only_for_a_journaled_request_from_its_family() -> None:
    state = _run(_intent())
    assert outcome_refusal(state, _outcome(), "payment") is None
    assert outcome_refusal(state, _outcome(), "booking") == OutcomeRefusal.WRONG_FAMILY
    assert outcome_refusal(state, _outcome(step=9), "payment") == OutcomeRefusal.UNREQUESTED
    assert outcome_refusal(state, _outcome(tool="create_booking"), "payment") == OutcomeRefusal.WRONG_TOOL
    assert (
        outcome_refusal(state, _outcome(step=7, key=action_key(RUN, 6)), "payment")
        == OutcomeRefusal.WRONG_STEP
    )
    assert outcome_refusal(state, _outcome(), "_wake") == OutcomeRefusal.WRONG_SUBJECT
    other_run = _outcome(run_id="run_000000000000000000000000")
    assert outcome_refusal(state, other_run, "payment") == OutcomeRefusal.WRONG_SUBJECT


def test_a_redelivered_outcome_of_a_completed_step_is_still_bound_to_its_request() -> None:
    done = ActionCompleted(
        run_id=RUN, at=NOW, step_no=6, key=action_key(RUN, 6), status=OutcomeStatus.SUCCEEDED
    )
    state = _run(_intent(), done)
    assert outcome_refusal(state, _outcome(), "payment") is None
    assert outcome_refusal(state, _outcome(), "notify") == OutcomeRefusal.WRONG_FAMILY


def test_a_wake_resolves_the_keys_it_names_that_are_pending_or_unknown() -> None:
    pending, unknown, settled = _intent(step=6), _intent(step=7), _intent(step=8)
    state = _run(
        pending,
        unknown,
        settled,
        ActionCompleted(run_id=RUN, at=NOW, step_no=7, key=unknown.key, status=OutcomeStatus.UNKNOWN),
        ActionCompleted(run_id=RUN, at=NOW, step_no=8, key=settled.key, status=OutcomeStatus.SUCCEEDED),
    )
    keys = [pending.key, unknown.key, settled.key, f"{RUN}:99"]
    assert [r.key for r in to_resolve(state, keys)] == [pending.key, unknown.key]
    assert to_resolve(state, []) == ()
    assert request_for(pending).key == pending.key
