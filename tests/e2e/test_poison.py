"""A message no service can handle is dead-lettered once, with its reason, and never blocks the messages behind it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_encoder
from crashsafe.contracts.keys import inbound_hash, run_id_for, tool_input_hash
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, OutcomeStatus, tool_encoder
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.stack_keys import STACK_TENANT
from tests.support.broker import action_subject, consumer_settled, dead_letters
from tests.support.capabilities import signed
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, CONFIRMED, projected


@pytest.fixture(scope="module")
async def shared(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path_factory.mktemp("poison"), nats_url=nats_server.url) as client:
        yield client


async def _letter_for(broker: Broker, ns: Namespace, subject: str, seq: int) -> DeadLetter | None:
    """The dead letter recorded for the message at `seq` on `subject`, once there is one."""
    letters = [d for d in await dead_letters(broker, ns) if d.subject == subject and d.stream_seq == seq]
    assert len(letters) <= 1, f"{subject} seq {seq} was dead-lettered {len(letters)} times"
    return letters[0] if letters else None


async def _completes_booked_and_paid(world: StackClient) -> None:
    run_id, guest = await world.start_run()
    summary = await world.wait_terminal(run_id)
    assert summary["status"] == "completed", summary
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


# Where a poison message can land: (subject, stream, durable consumer, the service that dead-letters it).
Target = Callable[[Namespace], tuple[str, str, str, str]]
TARGETS: dict[str, Target] = {
    "inbound": lambda ns: (
        ns.inbound(f"run_x{uuid.uuid4().hex[:8]}"),
        ns.stream(StreamKind.INBOUND),
        ns.runtime_inbound_consumer,
        "runtime",
    ),
    "action": lambda ns: (
        ns.actions("payment", 0),
        ns.stream(StreamKind.ACTIONS),
        ns.executor_consumer("payment", 0),
        "executor_payment",
    ),
    "outcome": lambda ns: (
        ns.outcomes("payment", f"run_x{uuid.uuid4().hex[:8]}"),
        ns.stream(StreamKind.OUTCOMES),
        ns.runtime_outcomes_consumer,
        "runtime",
    ),
}
POISONS = {
    "not_json": b"\x00{this is not json",
    "wrong_shape": b'{"type": "run.wake", "run_id": 7}',
}


@pytest.mark.parametrize("payload", list(POISONS))
@pytest.mark.parametrize("where", list(TARGETS))
async def test_undecodable_message_is_dead_lettered_once_and_does_not_block_others(
    shared: StackClient, broker: Broker, where: str, payload: str
) -> None:
    ns = shared.ns
    subject, stream, durable, service = TARGETS[where](ns)
    data = POISONS[payload]

    published = await broker.publish(subject, data, msg_id=unique("poison"))
    await _completes_booked_and_paid(shared)  # submitted right behind the poison

    letter = await eventually(
        lambda: _letter_for(broker, ns, subject, published.seq), what=f"a dead letter for {subject}"
    )
    assert letter.service == service
    assert letter.code == "poison_message"
    assert letter.reason.startswith("cannot decode")
    assert letter.deliveries == 1  # retrying cannot decode it: dead-lettered at the first delivery
    assert letter.payload == data.decode("utf-8", "replace")
    # Termed, not left pending: it will not come back.
    assert await eventually(
        lambda: consumer_settled(broker, stream, durable, published.seq),
        what=f"{durable} to settle seq {published.seq}",
    )


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("launch_rockets", "no tool"),  # no such tool anywhere
        ("create_booking", "no tool"),  # a real tool of another family, sent to the payment executor
    ],
)
async def test_action_request_for_a_tool_the_executor_lacks_is_dead_lettered(
    shared: StackClient, broker: Broker, tool: str, why: str
) -> None:
    ns = shared.ns
    now = datetime.now(UTC)
    key = f"{unique('run_poison')}:1"
    args = {"hotel_id": "lis-1", "guest_id": "g-poison", "check_in": "2031-12-01", "check_out": "2031-12-03"}
    # Signed as the runtime would: the capability is good, so what is refused is the tool, not the signature.
    request = ActionRequest(
        run_id=key.split(":")[0],
        step_no=1,
        tool=tool,
        family="payment",
        args=args,
        key=key,
        input_hash=tool_input_hash(tool, args),
        timeout_s=5.0,
        deadline_at=now + timedelta(seconds=5),
        requested_at=now,
    )
    subject = ns.actions("payment", 0)

    published = await broker.publish(subject, tool_encoder.encode(signed(request)), msg_id=unique("poison"))
    await _completes_booked_and_paid(shared)

    letter = await eventually(
        lambda: _letter_for(broker, ns, subject, published.seq), what="a dead letter for the unknown tool"
    )
    assert letter.service == "executor_payment"
    assert letter.code == "poison_message"
    assert why in letter.reason and repr(tool) in letter.reason
    assert letter.deliveries == 1
    assert await eventually(
        lambda: consumer_settled(
            broker, ns.stream(StreamKind.ACTIONS), ns.executor_consumer("payment", 0), published.seq
        ),
        what="the payment executor to settle the poison",
    )
    assert not [e for e in (await shared.ledger())["entries"] if e["key"] == key], (
        "a poison request reached a provider"
    )


async def test_guest_event_for_an_unknown_agent_is_refused_at_the_door(shared: StackClient) -> None:
    event_id = unique("ev")
    response = await shared.post_event(event_id, unique("g"), agent="no_such_agent")

    assert response.status_code == 422, response.text
    assert await shared.summary(run_id_for(STACK_TENANT, event_id)) is None


async def test_inbound_event_for_an_unknown_agent_is_dead_lettered_and_never_starts_a_run(
    shared: StackClient, broker: Broker
) -> None:
    # What an older gateway, or any other publisher, could still put on the inbound subject.
    ns = shared.ns
    key = unique("ev")
    message = InboundMessage(event_id=key, session_id="s", guest_id=unique("g"), text=BOOKING_TEXT)
    event = InboundEvent(
        key=key,
        run_id=run_id_for(STACK_TENANT, key),
        input_hash=inbound_hash(message, "booking"),
        message=message,
        agent="no_such_agent",
        received_at=datetime.now(UTC),
    )
    subject = ns.inbound(event.run_id)

    published = await broker.publish(subject, inbound_encoder.encode(event), msg_id=event.run_id)
    await _completes_booked_and_paid(shared)

    dead = await eventually(
        lambda: _letter_for(broker, ns, subject, published.seq), what="a dead letter for the unknown agent"
    )
    assert dead.service == "runtime"
    assert dead.code == "poison_message"
    assert "no_such_agent" in dead.reason
    assert dead.deliveries == 1
    assert await shared.summary(event.run_id) is None


async def test_request_with_unusable_args_is_poison_and_leaves_the_executor_restartable(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, namespace: Namespace
) -> None:
    stack = (await start_stack(executors=("booking",), reconciler=False)).stack
    now = datetime.now(UTC)
    key = f"{unique('run_badargs')}:1"
    request = ActionRequest(
        run_id=key.split(":")[0],
        step_no=1,
        tool="release_booking",
        family="booking",
        args={},  # release_booking needs booking_id
        key=key,
        input_hash=tool_input_hash("release_booking", {}),
        timeout_s=5.0,
        deadline_at=now + timedelta(seconds=5),
        requested_at=now,
    )
    log = stack.logs_dir / "executor-booking.log"
    subject = action_subject(namespace, "booking", key)
    published = await broker.publish(subject, tool_encoder.encode(signed(request)), msg_id=unique("badargs"))

    async def first_attempt_over() -> bool:
        return b"handler failed" in log.read_bytes() or bool(
            await _letter_for(broker, namespace, subject, published.seq)
        )

    await eventually(first_attempt_over, what="the executor to try the request once")
    offset = log.stat().st_size
    stack.restart("executor-booking", wait=False)

    async def came_up_or_died() -> str:
        tail = log.read_bytes()[offset:]
        return "ready" if b"ready: " in tail else "died" if b"Traceback" in tail else ""

    assert await eventually(came_up_or_died, what="the restarted executor to start or fail") == "ready"
    letter = await eventually(
        lambda: _letter_for(broker, namespace, subject, published.seq), what="a dead letter for the request"
    )
    assert letter.code == "poison_message"


async def test_outcome_reporting_an_effect_for_a_run_with_no_journal_is_dead_lettered(
    shared: StackClient, broker: Broker
) -> None:
    ns = shared.ns
    run_id = unique("run_ghost").replace("-", "")
    outcome = ActionOutcome(
        run_id=run_id,
        step_no=6,
        tool="create_payment",
        key=f"{run_id}:6",
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_ghost", "amount_cents": 24000},
        provider_ref="pay_ghost",
    )
    subject = ns.outcomes("payment", run_id)

    published = await broker.publish(subject, tool_encoder.encode(outcome), msg_id=unique("ghost"))
    assert await eventually(
        lambda: consumer_settled(
            broker, ns.stream(StreamKind.OUTCOMES), ns.runtime_outcomes_consumer, published.seq
        ),
        what="the runtime to settle the outcome",
    )

    letter = await _letter_for(broker, ns, subject, published.seq)  # written before the message is settled
    assert letter is not None, "the outcome was acked and dropped"
    assert letter.service == "runtime"
    assert letter.code == "outcome_refused" and letter.details["reason"] == "unrequested"
