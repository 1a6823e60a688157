"""Guest memory and retrieval on the real nats-server: a profile in KV reaches the run and the model, the
`remember_preference` tool writes it once through a real executor (also after a second delivery and a lost
store), and the passages a step used are journaled so a replay gives the model's view without searching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_encoder
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.contracts.memory import GuestProfile, profile_decoder, profile_encoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    ModelAnswered,
    RunCompleted,
    RunStarted,
    ToolCall,
)
from crashsafe.contracts.streams import guests_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionRequest, Via
from crashsafe.domain.agent import Agent
from crashsafe.domain.fold import passages_item, replay
from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.registry import KvOperation
from crashsafe.natsd import NatsServer
from crashsafe.services.agents.remember_preference import REMEMBER_PREFERENCE
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.providers.kv_effects import KvEffects
from crashsafe.services.records.guest_profiles import GuestProfiles, ProfileUnreadable
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.waiting import eventually, unique

TENANT = "acme"


@dataclass
class RecordingModel:
    """A model that records every input it is sent and answers from a script: (tool calls, reply) per call."""

    script: list[tuple[tuple[ToolCall, ...], str | None]] = field(default_factory=list)
    sent: list[tuple[dict[str, Any], ...]] = field(default_factory=list)

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        self.sent.append(items)
        calls, reply = self.script.pop(0) if self.script else ((), "done")
        return ModelReply(
            model="recorder",
            response_id=f"resp_{len(self.sent)}",
            tool_calls=calls,
            reply=reply,
            input_tokens=10,
            output_tokens=5,
        )


def _remember(name: str, value: str, n: int = 1) -> ToolCall:
    return ToolCall(
        call_id=f"call_mem_{n}",
        name="remember_preference",
        arguments=f'{{"name": "{name}", "value": "{value}"}}',
    )


@dataclass
class World:
    ns: Namespace
    broker: Broker  # the operator's
    journal: RunJournal
    settings: Any
    nats_url: str
    running: AsyncExitStack

    async def runtime(self, model: RecordingModel, library: Library | None = None) -> Runtime:
        worker = await self.running.enter_async_context(
            inprocess.runtime(self.settings("runtime"), model, library=library)
        )
        await worker.start()
        return worker

    async def send(self, guest: str, text: str) -> str:
        """A guest message as the gateway publishes it, for the tenant: returns its run id."""
        event_id = unique("evt")
        message = InboundMessage(event_id=event_id, session_id=f"sess-{event_id}", guest_id=guest, text=text)
        run_id = run_id_for(TENANT, event_id)
        event = InboundEvent(
            key=event_id,
            run_id=run_id,
            input_hash=inbound_hash(message, "booking"),
            message=message,
            agent="booking",
            received_at=datetime.now(UTC),
            tenant=TENANT,
        )
        await self.broker.publish(self.ns.inbound(run_id), inbound_encoder.encode(event), msg_id=run_id)
        return run_id

    async def finished(self, run_id: str) -> list[JournalEvent]:
        async def done() -> list[JournalEvent] | None:
            events, _ = await self.journal.read(run_id)
            return events if events and isinstance(events[-1], RunCompleted) else None

        return await eventually(done, what=f"run {run_id} completed")

    async def profile(self, guest: str) -> tuple[GuestProfile, int] | None:
        entry = await self.broker.kv_get(guests_spec(self.ns), self.ns.guest_key(TENANT, guest))
        return (profile_decoder.decode(entry.value), entry.revision) if entry else None


@pytest.fixture
async def world(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> AsyncIterator[World]:
    def settings(name: str, data: str = "data") -> Any:
        return inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / data, worker_id=name)

    await inprocess.provisioned(settings("operator"))
    operator = await Broker.connect(
        nats_server.url, "tests-memory-operator", access=access(nats_server.url, Role.OPERATOR)
    )
    async with AsyncExitStack() as running:
        try:
            yield World(
                namespace, operator, RunJournal(operator, namespace), settings, nats_server.url, running
            )
        finally:
            await running.aclose()
            await operator.close()


async def test_a_profile_in_kv_reaches_run_started_and_the_models_input(world: World) -> None:
    guest = unique("guest")
    stored = GuestProfile(
        guest_id=guest,
        verified_email="ana@example.com",
        preferences={"quiet_room": "yes", "late_check_in": "after 23:00"},
        applied=["run_old:2"],
    )
    await world.broker.kv_write(
        guests_spec(world.ns), world.ns.guest_key(TENANT, guest), profile_encoder.encode(stored), revision=0
    )
    model = RecordingModel()
    await world.runtime(model)

    events = await world.finished(await world.send(guest, "Book a room in Lisbon"))

    started = events[0]
    assert isinstance(started, RunStarted)
    # The run is told the profile, not the executor's bookkeeping of the keys that wrote it.
    assert started.profile == GuestProfile(
        guest_id=guest,
        verified_email="ana@example.com",
        preferences={"quiet_room": "yes", "late_check_in": "after 23:00"},
    )
    told = [i["content"] for i in model.sent[0] if i.get("role") == "developer"]
    assert "The guest's remembered preferences: late_check_in: after 23:00, quiet_room: yes" in told
    # The preferences come ahead of the guest's own words.
    assert model.sent[0][-1] == {"role": "user", "content": "Book a room in Lisbon"}


async def test_an_unknown_guest_starts_with_no_profile(world: World) -> None:
    model = RecordingModel()
    await world.runtime(model)

    events = await world.finished(await world.send(unique("guest"), "Book a room in Lisbon"))

    assert isinstance(events[0], RunStarted) and events[0].profile is None
    assert not any("preferences" in str(i.get("content", "")) for i in model.sent[0])


async def test_remember_preference_writes_the_profile_once_and_the_next_run_sees_it(world: World) -> None:
    guest = unique("guest")
    await GuestProfiles(world.broker, world.ns).set_identity(TENANT, guest, verified_email="ana@example.com")
    memory = await world.running.enter_async_context(
        inprocess.executor(world.settings("executor-a", "a"), "memory")
    )
    model = RecordingModel(script=[((_remember("quiet_room", "yes"),), None), ((), "I will remember that.")])
    runtime = await world.runtime(model)

    run_id = await world.send(guest, "I always want a quiet room")
    events = await world.finished(run_id)

    requested = next(e for e in events if isinstance(e, ActionRequested))
    completed = next(e for e in events if isinstance(e, ActionCompleted))
    assert requested.family == "memory"
    # The basis: the profile's version the run started from (the operator's one write), no writes of its own.
    assert requested.args == {
        "tenant": TENANT,
        "guest_id": guest,
        "name": "quiet_room",
        "value": "yes",
        "basis": "v1.0",
    }
    assert completed.status == "succeeded" and completed.result["remembered"] is True
    found = await world.profile(guest)
    assert found is not None
    profile, revision = found
    assert profile.preferences == {"quiet_room": "yes"}
    assert profile.verified_email == "ana@example.com"  # the operator's field survives the tool's write
    assert profile.applied == [requested.key]

    # The same request delivered again (a second message, past the dedup window): answered from the receipt.
    heard: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        heard.append(msgspec.json.decode(msg.data))

    listening = await world.broker.nc.subscribe(world.ns.outcomes("memory", run_id), cb=collect)
    await runtime.requests.publish(requested, context_from(None), msg_id="again", agent="booking")
    await eventually(lambda: len(heard) >= 1, what="the second delivery answered")
    assert heard[0]["via"] == Via.REPLAY and heard[0]["status"] == "succeeded"
    assert await world.profile(guest) == (profile, revision)

    # The executor's store is lost and another takes the partitions: it never saw the key, but the key's facts
    # (issue 17: they survive a store move) hold the settled receipt, so it answers from them as a replay; the
    # record is not written again.
    await memory.close()
    await world.running.enter_async_context(inprocess.executor(world.settings("executor-b", "b"), "memory"))
    await runtime.requests.publish(requested, context_from(None), msg_id="after-loss", agent="booking")
    await eventually(lambda: len(heard) >= 2, what="the lost store's key looked up")
    await listening.unsubscribe()
    assert heard[1]["via"] == Via.REPLAY and heard[1]["status"] == "succeeded"
    assert await world.profile(guest) == (profile, revision)

    # The next run of the guest is told the preference; its model asking to remember it again finds the
    # profile already saying so: no second write.
    second = RecordingModel(script=[((_remember("quiet_room", "yes", 2),), None), ((), "Noted.")])
    runtime.model = second
    events = await world.finished(await world.send(guest, "Book again, please"))
    assert isinstance(events[0], RunStarted) and events[0].profile is not None
    assert events[0].profile.preferences == {"quiet_room": "yes"}
    assert any("quiet_room: yes" in str(i.get("content", "")) for i in second.sent[0])
    again = next(e for e in events if isinstance(e, ActionRequested))
    assert again.args["basis"] == "v2.0"
    assert next(e for e in events if isinstance(e, ActionCompleted)).status == "succeeded"
    assert await world.profile(guest) == (profile, revision)


async def test_a_preference_write_that_clashes_with_another_writer_is_applied_to_the_record_as_it_became(
    world: World,
) -> None:
    guest = unique("guest")
    writer = await Broker.connect(
        world.nats_url, "tests-memory-executor", access=access(world.nats_url, Role.EXECUTOR, "memory")
    )
    try:
        effects = KvEffects(writer, world.ns)
        operation = REMEMBER_PREFERENCE.operation
        assert isinstance(operation, KvOperation)
        args = {"tenant": TENANT, "guest_id": guest, "name": "quiet_room", "value": "yes"}
        request = _request(args, "run_x:4")
        # Two writers at once: both read "no profile", one wins the revision, the other re-reads and applies.
        other = _request({**args, "name": "high_floor"}, "run_y:2")
        first, second = await asyncio.gather(effects.call(operation, request), effects.call(operation, other))
        assert first.kind == second.kind == "ok"
        found = await world.profile(guest)
        assert found is not None
        assert found[0].preferences == {"quiet_room": "yes", "high_floor": "yes"}
        assert sorted(found[0].applied) == ["run_x:4", "run_y:2"]
        looked = await effects.lookup(operation, "run_x:4", args)
        assert looked.kind == "found"
        absent = await effects.lookup(operation, "run_x:5", args)
        assert absent.kind == "absent"
    finally:
        await writer.close()


def _request(args: dict[str, Any], key: str) -> ActionRequest:
    run_id, _, step = key.partition(":")
    return ActionRequest(
        run_id=run_id,
        step_no=int(step),
        tool="remember_preference",
        family="memory",
        args=args,
        key=key,
        input_hash="0" * 64,
        timeout_s=3.0,
        deadline_at=datetime.now(UTC),
        requested_at=datetime.now(UTC),
    )


async def test_the_passages_a_step_used_are_journaled_and_a_replay_gives_the_models_view(
    world: World,
) -> None:
    model = RecordingModel(script=[((), "Free until 48 hours before check-in.")])
    await world.runtime(model, library=Library.stayhub())

    events = await world.finished(await world.send(unique("guest"), "What is the cancellation policy?"))

    answered = next(e for e in events if isinstance(e, ModelAnswered))
    assert answered.passages, "the cancellation policy sections were retrieved"
    assert answered.passages[0].doc == "Cancellation policy"
    assert all(p.text and p.score > 0 for p in answered.passages)
    # The model got exactly those passages, last, right before its answer's place.
    assert model.sent[0][-1] == passages_item(answered.passages)
    # Replay rebuilds what the model saw from the journal alone: no library, no search.
    state = replay(events)
    assert state is not None
    assert state.transcript[: len(model.sent[0])] == model.sent[0]
    assert state.searched_turns == 1


async def test_a_question_with_nothing_to_find_journals_no_passages(world: World) -> None:
    model = RecordingModel(script=[((), "Hello! How can I help?")])
    await world.runtime(model, library=Library.stayhub())

    events = await world.finished(await world.send(unique("guest"), "hello"))

    answered = next(e for e in events if isinstance(e, ModelAnswered))
    assert answered.passages == []
    assert not any("StayHub's documents" in str(i.get("content", "")) for i in model.sent[0])


async def test_a_record_written_past_the_cli_is_refused_never_overwritten(world: World) -> None:
    guest = unique("guest")
    key = world.ns.guest_key(TENANT, guest)
    await world.broker.kv_write(guests_spec(world.ns), key, b'{"preferences": 3}', revision=0)
    operation = REMEMBER_PREFERENCE.operation
    assert isinstance(operation, KvOperation)
    args = {"tenant": TENANT, "guest_id": guest, "name": "quiet_room", "value": "yes"}

    answer = await KvEffects(world.broker, world.ns).call(operation, _request(args, "run_z:1"))

    assert answer.kind == "rejected" and answer.body["code"] == "record_unreadable"
    entry = await world.broker.kv_get(guests_spec(world.ns), key)
    assert entry is not None and entry.value == b'{"preferences": 3}'
    with pytest.raises(ProfileUnreadable):
        await GuestProfiles(world.broker, world.ns).read(TENANT, guest)
