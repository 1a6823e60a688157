"""The wire is a public API: golden files pin every message's bytes, and the pure layers import no I/O library.

Regenerate the golden files after a deliberate, additive change with `CRASHSAFE_UPDATE_GOLDEN=1 pytest tests/unit/test_contracts.py`
and review the diff: a changed or removed line in an existing file is a breaking change (see contracts/README.md).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect
import pytest

import crashsafe.contracts
from crashsafe.contracts.capabilities import Capability
from crashsafe.contracts.checkpoints import Checkpoint, RunHead, checkpoint_decoder, checkpoint_encoder
from crashsafe.contracts.dead_letters import (
    DeadLetter,
    DeadLetterMark,
    dead_letter_decoder,
    dead_letter_encoder,
    dead_mark_decoder,
    dead_mark_encoder,
)
from crashsafe.contracts.errors import (
    AgentNotAllowed,
    BodyTooLarge,
    BrokerUnavailable,
    CatalogRevisionGone,
    CrashsafeError,
    ErrorInfo,
    IdempotencyConflict,
    InvalidCatalog,
    InvalidRequest,
    InvalidSetting,
    ModelUnavailable,
    PoisonMessage,
    RunNotFound,
    RunVersionConflict,
    SubjectFull,
    UnknownAgent,
    UnprocessableBody,
)
from crashsafe.contracts.inbound import (
    GuestMessage,
    InboundEvent,
    InboundMessage,
    inbound_decoder,
    inbound_encoder,
)
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.policy import (
    ApprovalAbove,
    DateWindow,
    OneActiveHold,
    RefundWithinPaid,
    ToolsAllowed,
    VerifiedRecipient,
    rule_decoder,
    rule_encoder,
)
from crashsafe.contracts.projections import (
    ProjectionFailed,
    ProjectionTask,
    failed_decoder,
    task_decoder,
    task_encoder,
)
from crashsafe.contracts.provider_view import (
    ProviderViewReply,
    ProviderViewRequest,
    provider_view_encoder,
    provider_view_reply_decoder,
    provider_view_request_decoder,
)
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    Budget,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    ToolCall,
    ToolRejected,
    TurnReceived,
    event_decoder,
    event_encoder,
)
from crashsafe.contracts.support import SupportTicket, support_decoder, support_encoder
from crashsafe.contracts.synthetic_turn import SyntheticTurn, synthetic_decoder, synthetic_encoder
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Evidence,
    OutcomeStatus,
    RecordStatus,
    RuntimeMessage,
    RunWake,
    action_request_decoder,
    runtime_message_decoder,
    tool_encoder,
)
from tests.support.paths import GOLDEN
from tests.support.world import BOOKING_TEXT

UPDATE = os.environ.get("CRASHSAFE_UPDATE_GOLDEN") == "1"

AT = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
LATER = datetime(2026, 12, 1, 9, 31, 45, 123456, tzinfo=UTC)
RUN = "run_94cb296d1a30794270b8b64f"
KEY = f"{RUN}:6"
ERROR = ErrorInfo(
    code="amount_mismatch", message="charge exactly 24000", retry="none", details={"expected_cents": 24000}
)

CAPABILITY = Capability(
    run_id=RUN,
    key=KEY,
    tool="create_payment",
    family="payment",
    input_hash="a" * 64,
    origin="plan",
    expires_at=LATER,
    kid="0123456789abcdef",
    sig="s" * 86,
)

# One fixed instance of every message that crosses a process boundary, named by its tag.
SAMPLES: list[msgspec.Struct] = [
    RunStarted(
        run_id=RUN,
        at=AT,
        agent="booking",
        session_id="sess-1",
        guest_id="guest-1",
        event_id="evt-1",
        idempotency_key="evt-1",
        input_hash="f" * 64,
        text=BOOKING_TEXT,
        budget=Budget(max_steps=20, max_tokens=60_000, deadline_s=90.0),
        deadline_at=LATER,
    ),
    ModelAnswered(
        run_id=RUN,
        at=AT,
        step_no=5,
        model="scripted-booking",
        response_id="resp_1",
        tool_calls=[ToolCall(call_id="call_1", name="create_payment", arguments='{"booking_id":"bk_1"}')],
        reply=None,
        input_tokens=120,
        output_tokens=16,
    ),
    ActionRequested(
        run_id=RUN,
        at=AT,
        step_no=6,
        call_id="call_1",
        tool="create_payment",
        family="payment",
        args={"booking_id": "bk_1", "guest_id": "guest-1", "amount_cents": 24000, "currency": "EUR"},
        key=KEY,
        input_hash="a" * 64,
        timeout_s=10.0,
        deadline_at=LATER,
        origin="model",
    ),
    ToolRejected(run_id=RUN, at=AT, step_no=7, call_id="call_2", tool="create_payment", error=ERROR),
    ActionCompleted(
        run_id=RUN,
        at=AT,
        step_no=6,
        key=KEY,
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_1", "amount_cents": 24000},
        error=None,
        provider_ref="pay_1",
        via="provider_lookup",
        attempts=1,
        deliveries=2,
        evidence=[
            Evidence(asked="provider.call", key=KEY, answer="unknown", detail="RemoteProtocolError", at=AT),
            Evidence(asked="provider.lookup", key=KEY, answer="found", detail="", at=LATER),
        ],
        tool="create_payment",
    ),
    RunNudged(run_id=RUN, at=AT, by="reconciler:r1", reason="1 action(s) past their timeout", keys=[KEY]),
    ModelAsked(run_id=RUN, at=AT, step_no=5, model="scripted-booking", input_bytes=2048),
    ModelRejected(
        run_id=RUN,
        at=AT,
        step_no=5,
        model="scripted-booking",
        response_id="resp_2",
        error=ErrorInfo(
            code="model_answer_too_large",
            message="the answer is 1200000 bytes, over the journal's limit of 1032192",
            details={"bytes": 1_200_000, "limit": 1_032_192},
        ),
        answer_bytes=1_200_000,
        input_tokens=120,
        output_tokens=300_000,
    ),
    RunResumed(
        run_id=RUN,
        at=AT,
        worker="runtime-1",
        next_step=7,
        reason="worker picked up a run it did not hold in memory",
    ),
    RunCompleted(run_id=RUN, at=AT, reply="Booked and paid."),
    RunHandedOff(run_id=RUN, at=AT, reason="outcome_unknown", detail=f"outcome of {KEY} is unknown"),
    PolicyDenied(
        run_id=RUN,
        at=AT,
        step_no=4,
        call_id="call_4",
        tool="create_booking",
        rule="stay_window",
        reason="a stay of 360 nights is over the limit of 30",
    ),
    ApprovalRequested(
        run_id=RUN,
        at=AT,
        step_no=6,
        approval_id="apr_94cb296d1a30794270b8b64f_6",
        call=ToolCall(call_id="call_6", name="create_payment", arguments='{"booking_id":"bk_1"}'),
        tool="create_payment",
        args={"booking_id": "bk_1", "guest_id": "guest-1", "amount_cents": 184000, "currency": "EUR"},
        input_hash="b" * 64,
        amount_cents=184000,
        currency="EUR",
        approver="manager",
        rule="approval_above",
        reason="1840.00 EUR is over the auto-approve limit of 1000.00 EUR",
        expires_at=AT,
        question="pay 1840.00 EUR for booking bk_1",
    ),
    ApprovalDecided(
        run_id=RUN,
        at=AT,
        approval_id="apr_94cb296d1a30794270b8b64f_6",
        decision="approved",
        decided_by="manager:ana@corp.example",
        reason="conference trip",
        input_hash="b" * 64,
    ),
    TurnReceived(run_id=RUN, at=AT, event_id="evt-2", text="yes"),
    ToolsAllowed(tools=["search_hotels", "create_booking"]),
    DateWindow(
        tools=["search_hotels", "create_booking"],
        max_nights=30,
        start_field="check_in",
        end_field="check_out",
        max_days_ahead=365,
        start_label="check-in",
    ),
    ApprovalAbove(tool="create_payment", limit_cents=100000, approver="manager", for_field="booking_id"),
    VerifiedRecipient(),
    OneActiveHold(
        tool="create_booking",
        holder_fields=["guest_id"],
        same_fields=["hotel_id"],
        start_field="check_in",
        end_field="check_out",
        result_field="booking_id",
    ),
    RefundWithinPaid(
        tool="refund_payment",
        payment_field="payment_id",
        listing_tool="find_payments",
        listing_field="payments",
        charge_tool="create_payment",
    ),
    ActionRequest(
        run_id=RUN,
        step_no=6,
        tool="create_payment",
        family="payment",
        args={"booking_id": "bk_1", "guest_id": "guest-1", "amount_cents": 24000, "currency": "EUR"},
        key=KEY,
        input_hash="a" * 64,
        timeout_s=10.0,
        deadline_at=LATER,
        requested_at=AT,
        capability=CAPABILITY,
    ),
    CAPABILITY,
    ActionOutcome(
        run_id=RUN,
        step_no=6,
        tool="create_payment",
        key=KEY,
        status=OutcomeStatus.FAILED,
        result={},
        error=ERROR,
        provider_ref=None,
        via="call",
        attempts=2,
        deliveries=1,
        evidence=[
            Evidence(asked="provider.call", key=KEY, answer="rejected", detail="provider answered 422", at=AT)
        ],
    ),
    RunWake(
        run_id=RUN, reason="journal quiet for 30s with nothing in flight", at=AT, by="reconciler", keys=[KEY]
    ),
    InboundEvent(
        key="evt-1",
        run_id=RUN,
        input_hash="f" * 64,
        message=InboundMessage(
            event_id="evt-1", session_id="sess-1", guest_id="guest-1", text="Book a room in Lisbon"
        ),
        agent="booking",
        received_at=AT,
    ),
    Checkpoint(
        kid="0123456789abcdef",
        signed_at=AT,
        prev="0" * 64,
        root="a" * 64,
        size=1,
        sig="c2lnbmF0dXJl",
        heads=[RunHead(RUN, 7, "b" * 64)],
    ),
    SupportTicket(
        run_id=RUN,
        tenant="acme",
        agent="booking",
        guest_id="guest-1",
        session_id="sess-1",
        reason="loop",
        detail="the model asked for search_hotels with the same arguments 4 times (at most 3)",
        reply="A member of our support team will take over.",
        at=AT,
    ),
    DeadLetter(
        service="executor_payment",
        subject="crashsafe.action.payment.3",
        stream_seq=42,
        deliveries=12,
        reason="executor payment has no tool 'transfer'",
        code="poison_message",
        payload='{"type":"action.request"}',
        at=AT,
    ),
    DeadLetterMark(
        stream_seq=42,
        settled="replayed",
        by="console:k_1",
        at=AT,
        replayed_to="crashsafe.outcome._wake." + RUN,
    ),
    ProviderViewRequest(tool="create_booking", key="k" * 64, args={"hotel_id": "lis-1"}),
    ProviderViewReply(answer="found", ref="bk_1", effect={"booking_id": "bk_1", "status": "held"}),
    ProjectionTask(
        tool="send_confirmation_email",
        key="email:" + "e" * 64,
        run_id=RUN,
        tenant="acme",
        agent="booking",
        args={"booking_id": "bk_1", "guest_id": "guest-1", "to": "ana@example.com"},
        planned_at=AT,
    ),
    ProjectionFailed(
        tool="send_confirmation_email",
        key="email:" + "e" * 64,
        run_id=RUN,
        tenant="acme",
        attempts=31,
        code="projection_exhausted",
        reason="not delivered after 31 attempts over 7200.4s (last: provider answered 503)",
        planned_at=AT,
        at=LATER,
    ),
    SyntheticTurn(
        result="ok",
        reason="searched 3 hotel(s), answered: synthetic: ok: 3 hotel(s) found",
        duration_s=0.842,
        budget_s=30.0,
        run_id=RUN,
        by="reconciler",
        at=AT,
    ),
]


def codec(sample: msgspec.Struct) -> tuple[msgspec.json.Encoder, msgspec.json.Decoder[Any]]:
    """The one encoder and decoder of the sample's family, as the services use them."""
    match sample:
        case (
            RunStarted()
            | ModelAnswered()
            | ActionRequested()
            | ToolRejected()
            | ActionCompleted()
            | ModelAsked()
            | ModelRejected()
            | RunNudged()
            | RunResumed()
            | RunCompleted()
            | RunHandedOff()
            | PolicyDenied()
            | ApprovalRequested()
            | ApprovalDecided()
            | TurnReceived()
        ):
            return event_encoder, event_decoder
        case (
            ToolsAllowed()
            | DateWindow()
            | ApprovalAbove()
            | VerifiedRecipient()
            | OneActiveHold()
            | RefundWithinPaid()
        ):
            return rule_encoder, rule_decoder
        case ActionRequest():
            return tool_encoder, action_request_decoder
        case ActionOutcome() | RunWake():
            return tool_encoder, runtime_message_decoder
        case InboundEvent():
            return inbound_encoder, inbound_decoder
        case DeadLetter():
            return dead_letter_encoder, dead_letter_decoder
        case DeadLetterMark():
            return dead_mark_encoder, dead_mark_decoder
        case ProviderViewRequest():
            return provider_view_encoder, provider_view_request_decoder
        case ProviderViewReply():
            return provider_view_encoder, provider_view_reply_decoder
        case SupportTicket():
            return support_encoder, support_decoder
        case Checkpoint():
            return checkpoint_encoder, checkpoint_decoder
        case ProjectionTask():
            return task_encoder, task_decoder
        case ProjectionFailed():
            return task_encoder, failed_decoder
        case SyntheticTurn():
            return synthetic_encoder, synthetic_decoder
        case Capability():
            return tool_encoder, msgspec.json.Decoder(Capability)
    raise AssertionError(f"no codec for {type(sample).__name__}")


def tag_of(cls: type[msgspec.Struct]) -> str:
    return str(cls.__struct_config__.tag)


def golden_path(sample: msgspec.Struct) -> Path:
    return GOLDEN / f"{tag_of(type(sample))}.json"


def check_golden(path: Path, encoded: bytes) -> bytes:
    """Compare an encoding with its committed file; write the file instead when CRASHSAFE_UPDATE_GOLDEN=1."""
    pretty = msgspec.json.format(encoded, indent=2) + b"\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pretty)
    assert path.exists(), (
        f"{path.name} is missing; run with CRASHSAFE_UPDATE_GOLDEN=1 to create it, then commit it"
    )
    assert path.read_bytes() == pretty, (
        f"{path.name}: the wire format changed. Fields may only be added, with defaults; if this change is deliberate "
        "and additive, regenerate with CRASHSAFE_UPDATE_GOLDEN=1 and review the diff"
    )
    return pretty


def ids(sample: msgspec.Struct) -> str:
    return tag_of(type(sample))


@pytest.mark.parametrize("sample", SAMPLES, ids=ids)
def test_encoding_matches_the_golden_file(sample: msgspec.Struct) -> None:
    encoder, _ = codec(sample)
    check_golden(golden_path(sample), encoder.encode(sample))


@pytest.mark.parametrize("sample", SAMPLES, ids=ids)
def test_golden_file_decodes_and_round_trips(sample: msgspec.Struct) -> None:
    encoder, decoder = codec(sample)
    golden = golden_path(sample).read_bytes()
    decoded = decoder.decode(golden)
    assert type(decoded) is type(sample) and decoded == sample
    assert msgspec.json.format(encoder.encode(decoded), indent=2) + b"\n" == golden
    assert json.loads(golden)["type"] == tag_of(type(sample))


NEW_FIELD = "added_in_a_later_version"


def _widen(value: Any, info: msgspec.inspect.Type) -> Any:
    """The same message as a newer writer might send it: a new field on the message and on every nested struct.

    Free-form objects (args, result, details) are left alone: a new key there is data, not schema.
    """
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        widened = {k: _widen(v, fields[k]) if k in fields else v for k, v in value.items()}
        return {**widened, NEW_FIELD: {"nested": [1, 2, 3]}}
    if isinstance(info, msgspec.inspect.UnionType):
        structs = [t for t in info.types if isinstance(t, msgspec.inspect.StructType)]
        if len(structs) == 1:
            return _widen(value, structs[0])
    if isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        return [_widen(v, info.item_type) for v in value]
    return value


@pytest.mark.parametrize(
    "sample",
    SAMPLES,
    ids=ids,
)
def test_old_readers_skip_fields_added_later(sample: msgspec.Struct) -> None:
    _, decoder = codec(sample)
    widened = _widen(json.loads(golden_path(sample).read_bytes()), msgspec.inspect.type_info(type(sample)))
    assert NEW_FIELD in widened
    assert decoder.decode(json.dumps(widened).encode()) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=ids)
def test_messages_from_before_a_defaulted_field_existed_still_decode(sample: msgspec.Struct) -> None:
    """Fields with defaults are the only kind that may be added; an old message without them must decode."""
    _, decoder = codec(sample)
    golden = json.loads(golden_path(sample).read_bytes())
    defaulted = [
        f
        for f in msgspec.structs.fields(type(sample))
        if f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT
    ]
    older = {k: v for k, v in golden.items() if k not in {f.name for f in defaulted}}
    decoded = decoder.decode(json.dumps(older).encode())
    for f in defaulted:
        expected = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()  # type: ignore[misc]
        assert getattr(decoded, f.name) == expected


def test_an_unknown_tag_is_refused_not_guessed() -> None:
    golden = json.loads((GOLDEN / "run.completed.json").read_bytes())
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'run.reopened'"):
        event_decoder.decode(json.dumps({**golden, "type": "run.reopened"}).encode())


def _contract_structs() -> Iterator[type[msgspec.Struct]]:
    for info in pkgutil.walk_packages(crashsafe.contracts.__path__, prefix="crashsafe.contracts."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, msgspec.Struct)
                and value.__module__ == module.__name__
            ):
                yield value


def test_every_wire_message_has_an_explicit_unique_tag_and_a_golden() -> None:
    structs = set(_contract_structs())
    tagged = {cls for cls in structs if cls.__struct_config__.tag_field is not None}
    bases = {cls for cls in tagged if any(other is not cls and issubclass(other, cls) for other in tagged)}
    concrete = tagged - bases
    for cls in concrete:
        assert cls.__struct_config__.tag_field == "type", cls
        assert tag_of(cls) != cls.__name__, (
            f"{cls.__name__} uses its class name as tag: a rename would change the wire"
        )
        assert tag_of(cls).islower() and " " not in tag_of(cls), cls
        assert cls.__struct_config__.frozen, f"{cls.__name__} must be frozen"
    tags = [tag_of(cls) for cls in concrete]
    assert len(tags) == len(set(tags)), sorted(tags)
    assert sorted(tags) == sorted(tag_of(type(s)) for s in SAMPLES), (
        "every wire message needs a sample and a golden file"
    )
    for union in (RunEvent, RuntimeMessage):
        for member in union.__args__:  # type: ignore[attr-defined]
            assert member in concrete, member
    # Every golden file on disk belongs to a sample: a removed message type is a breaking change.
    on_disk = {p.name for p in GOLDEN.glob("*.json")}
    assert on_disk == {golden_path(s).name for s in SAMPLES}


def test_no_event_forbids_unknown_fields() -> None:
    """Events never forbid unknown fields; only HTTP bodies may (GuestMessage, ApprovalDecisionBody)."""
    strict = {cls.__name__ for cls in _contract_structs() if cls.__struct_config__.forbid_unknown_fields}
    assert strict == {"GuestMessage", "ApprovalDecisionBody"}


# Messages built from other messages ---------------------------------------------------------------------------


def test_a_request_rebuilt_from_its_journaled_intent_is_the_same_request() -> None:
    """What the reconciler and a resumed runtime send again: the same key, input and deadline, every time."""
    intent = next(s for s in SAMPLES if isinstance(s, ActionRequested))
    request = request_for(intent)

    assert request == ActionRequest(
        run_id=intent.run_id,
        step_no=intent.step_no,
        tool=intent.tool,
        family=intent.family,
        args=intent.args,
        key=intent.key,
        input_hash=intent.input_hash,
        timeout_s=intent.timeout_s,
        deadline_at=intent.deadline_at,
        requested_at=intent.at,
    )
    assert (request.key, request.requested_at) == (KEY, AT)


def test_the_inbound_message_carries_the_guest_message_field_for_field() -> None:
    guest = GuestMessage(event_id="evt-1", session_id="sess-1", guest_id="guest-1", text=BOOKING_TEXT)
    assert InboundMessage.of(guest) == InboundMessage("evt-1", "sess-1", "guest-1", BOOKING_TEXT)


@pytest.mark.parametrize(
    ("status", "row"),
    [
        (OutcomeStatus.SUCCEEDED, RecordStatus.SUCCEEDED),
        (OutcomeStatus.FAILED, RecordStatus.FAILED),
        (OutcomeStatus.UNKNOWN, RecordStatus.UNKNOWN),
        (OutcomeStatus.CONFLICT, RecordStatus.UNKNOWN),
    ],
)
def test_only_a_success_or_a_failure_settles_a_key_in_the_executor_store(
    status: OutcomeStatus, row: RecordStatus
) -> None:
    assert RecordStatus.of(status) is row
    assert row.settled == (status in (OutcomeStatus.SUCCEEDED, OutcomeStatus.FAILED))


# Errors travel as ErrorInfo: a stable code, a retry class and the facts (the message is for people) ------------


@pytest.mark.parametrize(
    ("make", "code", "retry", "details"),
    [
        (lambda: InvalidRequest("unreadable", key="k-1"), "invalid_request", "none", {"key": "k-1"}),
        (lambda: UnprocessableBody("bad field"), "invalid_request", "none", {}),
        (
            lambda: UnknownAgent("concierge", known=["booking"]),
            "invalid_request",
            "none",
            {"agent": "concierge", "known": ["booking"]},
        ),
        (
            lambda: UnknownAgent("a" * 100, known=[]),
            "invalid_request",
            "none",
            {"agent": "a" * 64, "known": []},
        ),
        (
            lambda: InvalidSetting(variable="CRASHSAFE_PARTITIONS", value="x" * 300, expected="0-3"),
            "invalid_setting",
            "none",
            {"variable": "CRASHSAFE_PARTITIONS", "value": "x" * 200, "expected": "0-3"},
        ),
        (
            lambda: BodyTooLarge(size=20_000, limit=16_384),
            "body_too_large",
            "none",
            {"size": 20_000, "limit": 16_384},
        ),
        (
            lambda: IdempotencyConflict(key="k-1", run_id="run_x"),
            "idempotency_conflict",
            "none",
            {"key": "k-1", "run_id": "run_x"},
        ),
        (lambda: RunNotFound(run_id="run_x"), "run_not_found", "none", {"run_id": "run_x"}),
        (
            lambda: RunVersionConflict(subject="crashsafe.run.run_x", expected_seq=3),
            "run_version_conflict",
            "retry_later",
            {"subject": "crashsafe.run.run_x", "expected_seq": 3},
        ),
        (
            lambda: SubjectFull(subject="crashsafe.inbound.run_x"),
            "subject_full",
            "none",
            {"subject": "crashsafe.inbound.run_x"},
        ),
        (
            lambda: BrokerUnavailable("no JetStream", url="nats://n:4222"),
            "broker_unavailable",
            "retry_later",
            {"url": "nats://n:4222"},
        ),
        (
            lambda: BrokerUnavailable("no JetStream", subject="s"),
            "broker_unavailable",
            "retry_later",
            {"subject": "s"},
        ),
        (
            lambda: ModelUnavailable("timed out", model="m-1"),
            "model_unavailable",
            "retry_later",
            {"model": "m-1"},
        ),
        (
            lambda: PoisonMessage("undecodable", key="k-1", run_id="run_x", missing=["booking_id"]),
            "poison_message",
            "poison",
            {"key": "k-1", "run_id": "run_x", "missing": ["booking_id"]},
        ),
        (lambda: PoisonMessage("undecodable"), "poison_message", "poison", {}),
        (
            lambda: InvalidCatalog(["agents.x: unknown agent"], revision=7),
            "invalid_catalog",
            "poison",
            {"problems": ["agents.x: unknown agent"], "revision": 7},
        ),
        (
            lambda: CatalogRevisionGone(revision=3, agent="booking"),
            "catalog_revision_gone",
            "poison",
            {"revision": 3, "agent": "booking"},
        ),
        (
            lambda: AgentNotAllowed(agent="booking", allowed="synthetic", tenant="synthetic", key_id="k1"),
            "forbidden",
            "none",
            {"agent": "booking", "allowed": "synthetic", "tenant": "synthetic", "key_id": "k1"},
        ),
    ],
)
def test_an_error_travels_as_its_code_retry_class_and_facts(
    make: Callable[[], CrashsafeError], code: str, retry: str, details: dict[str, Any]
) -> None:
    error = make()  # built here, not at import: a constructor's mutant is live only while a test runs
    info = error.info()
    assert (info.code, info.retry, info.details) == (code, retry, details)
    assert info.message == error.message
