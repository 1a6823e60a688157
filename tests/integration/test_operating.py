"""The operating pages' backends on the real nats-server with the real users: the provider's by-key view through
a real executor and the sandbox, and dead letters replayed once (a double click) or discarded, as the gateway."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import nats
import pytest

from crashsafe.contracts.dead_letters import DeadLetter, Settled, dead_letter_encoder
from crashsafe.contracts.errors import DeadLetterNotFound, DeadLetterSettled, NotPermitted, ReplayRefused
from crashsafe.contracts.keys import action_key, input_hash, partition_of
from crashsafe.contracts.nats_permissions import Role, inbox_prefix, user_name
from crashsafe.contracts.projections import ProjectionTask, task_encoder
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace, StreamKind
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    RunWake,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.domain import registry as registries
from crashsafe.domain.projection_plan import plan
from crashsafe.natsd import NatsServer
from crashsafe.services.operations.dead_letter_tasks import DeadLetters, replay_msg_id
from crashsafe.services.operations.replan import replanner
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import read_credential
from crashsafe.services.providers import provider_views
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.capabilities import signed
from tests.support.nats_users import access
from tests.support.runs import RUN, T0, Run, started
from tests.support.waiting import eventually

TOOLS = inprocess.REGISTRY.tools
DEFAULT_REGISTRY = "crashsafe.services.agents:stayhub"


@pytest.fixture
async def gateway(nats_server: NatsServer, namespace: Namespace) -> AsyncIterator[Broker]:
    """A connection as the gateway's NATS user: what the console's pages may do is what this may do."""
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    b = await Broker.connect(nats_server.url, "tests-gateway", access=access(nats_server.url, Role.GATEWAY))
    yield b
    await b.close()


def _request(run_id: str, tool: str, args: dict[str, object]) -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id=run_id,
        step_no=1,
        tool=tool,
        family=TOOLS[tool].contract.family,
        args=args,
        key=action_key(run_id, 1),
        input_hash=input_hash({"tool": tool, "args": args}),
        timeout_s=5.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )


async def test_the_provider_view_answers_by_key_through_the_executor(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, gateway: Broker, tmp_path: Path
) -> None:
    booking_tool = TOOLS["create_booking"]
    # No executor of the family runs yet: the view says so, it does not hang or fail.
    nobody = await provider_views.ask(gateway, namespace, booking_tool, "k-none", {}, timeout_s=1.0)
    assert nobody.answer == provider_views.NO_ANSWER and "did not answer" in nobody.detail

    async with inprocess.sandbox_server() as sandbox_url:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data"
        )
        outcomes: list[ActionOutcome] = []

        async def collect(msg: object) -> None:
            message = runtime_message_decoder.decode(msg.data)  # type: ignore[attr-defined]
            if isinstance(message, ActionOutcome):
                outcomes.append(message)

        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        async with inprocess.executor(settings, "booking"):
            run_id = "run_" + uuid.uuid4().hex[:24]
            args = {
                "hotel_id": "lis-1",
                "guest_id": "g-1",
                "check_in": "2031-12-01",
                "check_out": "2031-12-03",
            }
            request = _request(run_id, "create_booking", args)
            subject = namespace.actions("booking", partition_of(request.key, DEFAULT_ACTION_PARTITIONS))
            await broker.publish(subject, tool_encoder.encode(signed(request)))
            (done,) = await eventually(lambda: outcomes or None, what="the booking's outcome", timeout_s=30)
            assert done.status == OutcomeStatus.SUCCEEDED

            found = await provider_views.ask(gateway, namespace, booking_tool, request.key, args)
            assert found.answer == "found"
            assert found.effect["booking_id"] == done.result["booking_id"] == found.ref
            absent = await provider_views.ask(gateway, namespace, booking_tool, "never-sent", args)
            assert absent.answer == "absent"
            search = await provider_views.ask(gateway, namespace, TOOLS["search_hotels"], request.key, {})
            assert search.answer == "no_lookup" and "no lookup by key" in search.detail
            # Hostile input is answered, not crashed on: a question that is no question.
            raw = await gateway.nc.request(namespace.provider_view("booking"), b"<script>", timeout=5)
            assert b'"answer":"unknown"' in raw.data
        await sub.unsubscribe()


async def _dead(broker: Broker, ns: Namespace, service: str, subject: str, payload: bytes) -> int:
    letter = DeadLetter(
        service=service,
        subject=subject,
        stream_seq=7,
        deliveries=20,
        reason="gave up",
        code="handler_failed",
        payload=payload.decode(),
        at=datetime.now(UTC),
    )
    published = await broker.publish(ns.dead_letters(service), dead_letter_encoder.encode(letter))
    return published.seq


async def test_a_dead_letter_replayed_by_a_double_click_is_sent_once(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, gateway: Broker
) -> None:
    run_id = "run_" + uuid.uuid4().hex[:24]
    request = _request(run_id, "create_booking", {"hotel_id": "lis-1"})
    subject = namespace.actions("booking", 0)
    seq = await _dead(broker, namespace, "executor_booking", subject, tool_encoder.encode(request))
    letters = DeadLetters(gateway, namespace)
    (listed,) = await letters.list()
    assert (listed.seq, listed.run_id, listed.mark) == (seq, run_id, None)

    # Two gateway replicas, each with its own connection, clicked at once.
    other = await Broker.connect(
        nats_server.url, "tests-gateway-2", access=access(nats_server.url, Role.GATEWAY)
    )
    try:
        replica = DeadLetters(other, namespace)
        first, second = await asyncio.gather(
            letters.replay(await letters.get(seq), "operator:a"),
            replica.replay(await replica.get(seq), "operator:b"),
            return_exceptions=True,
        )
    finally:
        await other.close()
    results = [first, second]
    marks = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, DeadLetterSettled)]
    assert len(marks) == 1 and len(refused) == 1, results
    assert marks[0].settled == Settled.REPLAYED and marks[0].replayed_to == namespace.wakes(run_id)
    # An action is never forged by whoever replays: the run is woken naming the key, once.
    wakes = await broker.read_subject(namespace.stream(StreamKind.OUTCOMES), namespace.wakes(run_id))
    assert len(wakes) == 1
    wake = runtime_message_decoder.decode(wakes[0].data)
    assert isinstance(wake, RunWake) and wake.keys == [request.key]
    assert wakes[0].headers["Nats-Msg-Id"] == replay_msg_id(namespace.stream(StreamKind.DEAD_LETTERS), seq)
    # Clicked again later (past any duplicate window): the mark refuses it, nothing is sent.
    with pytest.raises(DeadLetterSettled):
        await letters.replay(await letters.get(seq), "operator:c")
    assert len(await broker.read_subject(namespace.stream(StreamKind.OUTCOMES), namespace.wakes(run_id))) == 1
    (after,) = await letters.list()
    assert after.mark is not None and after.mark.by in {"operator:a", "operator:b"}
    for missing in (0, -1, seq + 100):
        with pytest.raises(DeadLetterNotFound):
            await letters.get(missing)


async def test_a_dead_projection_is_planned_again_from_its_journal_once_and_a_discarded_letter_is_never_replayed(
    namespace: Namespace, broker: Broker, gateway: Broker
) -> None:
    # An ended run's journal: its planned projections are what the replay may send, planned again now.
    run = Run(started())
    run.answer(text="Here is what I found.")
    run.decide()
    journal = RunJournal(broker, namespace)
    seq = 0
    for event in run.events:
        seq = await journal.append(event, seq)
    assert run.state.terminal
    product = registries.load(DEFAULT_REGISTRY)  # the product's agents: every ended run plans its audit trail
    (trail,) = plan(run.state, run.state.events, product.agent("booking"), product.tools, T0)
    planned = msgspec.structs.replace(trail, planned_at=T0)
    subject = namespace.projection(trail.tool, RUN)
    projection_seq = await _dead(broker, namespace, "projector", subject, task_encoder.encode(planned))
    # The console (the gateway) cannot plan: it is refused, pointing at the operator's commands, and the gateway's
    # NATS user could not publish a task anyway (a task says what the projector sends).
    plain = DeadLetters(gateway, namespace)
    with pytest.raises(ReplayRefused, match="dead-letters replay"):
        await plain.replay(await plain.get(projection_seq), "a")
    with pytest.raises(NotPermitted):
        await gateway.publish(subject, task_encoder.encode(planned))
    # With operator credentials (`crashsafe dead-letters replay`): planned again from the journal, sent once.
    letters = DeadLetters(broker, namespace, replanner(broker, namespace, product))
    mark = await letters.replay(await letters.get(projection_seq), "operator:a")
    assert mark.replayed_to == subject
    (sent,) = await broker.read_subject(namespace.stream(StreamKind.PROJECTIONS), subject)
    again = msgspec.json.decode(sent.data, type=ProjectionTask)
    # Planned again (after its dead receipt, so the projector attempts it); the same key, so the receiver dedupes.
    assert again.key == trail.key and again.planned_at > T0
    # A projection whose run no longer calls for it is refused: nothing is sent.
    gone = msgspec.structs.replace(planned, key="email:not-planned")
    gone_seq = await _dead(broker, namespace, "projector", subject, task_encoder.encode(gone))
    with pytest.raises(ReplayRefused, match="no longer calls for"):
        await letters.replay(await letters.get(gone_seq), "operator:a")
    assert len(await broker.read_subject(namespace.stream(StreamKind.PROJECTIONS), subject)) == 1

    run_id = "run_" + uuid.uuid4().hex[:24]
    outcome = ActionOutcome(
        run_id=run_id, step_no=1, tool="create_booking", key="k1", status=OutcomeStatus.UNKNOWN
    )
    outcome_seq = await _dead(
        broker, namespace, "runtime", namespace.outcomes("booking", run_id), tool_encoder.encode(outcome)
    )
    discarded = await letters.discard(await letters.get(outcome_seq), "operator:a")
    assert discarded.settled == Settled.DISCARDED
    with pytest.raises(DeadLetterSettled):
        await letters.replay(await letters.get(outcome_seq), "operator:b")
    assert await broker.read_subject(namespace.stream(StreamKind.OUTCOMES), namespace.wakes(run_id)) == []

    # A run's inbound event cannot be sent twice (the stream keeps one per run): refused, nothing sent.
    inbound_seq = await _dead(broker, namespace, "runtime", namespace.inbound(run_id), b'{"type":"x"}')
    with pytest.raises(ReplayRefused):
        await letters.replay(await letters.get(inbound_seq), "operator:a")
    assert (await letters.get(inbound_seq)).mark is None


async def test_no_other_role_may_settle_a_dead_letter_or_speak_for_the_provider(
    nats_server: NatsServer, namespace: Namespace, gateway: Broker
) -> None:
    """An analytics reader or an executor marking a letter settled, an executor of another family answering the
    booking family's provider views: refused by the server. (The runtime's refusal needs a concrete namespace:
    this server's users span every test namespace, where `$KV.*.>` is any bucket; the sweep in
    test_nats_permissions.py checks it on one.)"""
    for role, family in ((Role.ANALYTICS, None), (Role.EXECUTOR, "payment")):
        intruder = await Broker.connect(
            nats_server.url, f"tests-{role.value}", access=access(nats_server.url, role, family)
        )
        try:
            with pytest.raises(NotPermitted):
                await DeadLetters(intruder, namespace)._mark(1, Settled.DISCARDED, "intruder")
        finally:
            await intruder.close()
    refused: list[str] = []

    async def noted(exc: Exception) -> None:
        refused.append(str(exc))

    creds = access(nats_server.url, Role.EXECUTOR, "payment").creds
    assert creds is not None
    payment = await nats.connect(
        nats_server.url,
        nkeys_seed_str=read_credential(creds).seed,
        inbox_prefix=inbox_prefix(user_name(Role.EXECUTOR, "payment")),
        error_cb=noted,
        allow_reconnect=False,
    )
    try:
        await payment.subscribe(namespace.provider_view("booking"), cb=_never)
        await payment.flush()
        await eventually(lambda: refused, what="the server's refusal", timeout_s=5)
        assert "permissions violation" in refused[0].lower()
        # Nobody answers for booking, then: the gateway's view says so instead of a forged answer.
        view = await provider_views.ask(gateway, namespace, TOOLS["create_booking"], "k", {}, timeout_s=1.0)
        assert view.answer == provider_views.NO_ANSWER
    finally:
        await payment.close()


async def _never(msg: object) -> None:
    raise AssertionError("a refused subscription received a message")
