"""A deployment decides which agents and tools run: a test composes a runtime and an executor with its own."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_encoder
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.contracts.run_events import RunCompleted, RunStarted, ToolCall
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tools import Effect, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase, ScriptedStep
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.domain.run_state import RunState
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import submit_inbound
from tests.support.waiting import eventually

STAMP = ToolContract(name="stamp", family="stamps", effect=Effect.WRITE, timeout_s=2.0, retry=RetryRule.KEYED)


class TwoStamps(AgentBase):
    """A tiny agent of the test's own: two keyed `stamp` steps from a plan, then a reply."""

    name = "two_stamps"
    instructions = ""
    tools = {STAMP.name: STAMP}
    compensation_tools: dict[str, ToolContract] = {}
    config = AgentConfig(agent="two_stamps")

    def script(self, state: RunState) -> ScriptedStep | None:
        done = len(state.completed)
        if done < 2:
            return ScriptedStep(
                calls=(ToolCall(call_id=f"s{done}", name="stamp", arguments='{"n": %d}' % done),)
            )
        return ScriptedStep(reply="stamped twice")

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return {"n": int(args["n"])}


async def test_a_runtime_and_an_executor_composed_with_an_agent_of_the_tests_own(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    stamped: list[str] = []

    async def stamp(args: dict[str, Any], key: str) -> dict[str, Any]:
        stamped.append(key)
        return {"stamped": args["n"]}

    registry = Registry.of(Registration(agent=TwoStamps(), tools=(Tool(STAMP, LocalOperation(stamp)),)))
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path)
    async with (
        inprocess.runtime(settings, registry=registry) as runtime,
        inprocess.executor(settings, "stamps", registry=registry),
    ):
        await runtime.start()
        run_id = await submit_inbound(broker, namespace, "evt-1", agent="two_stamps", text="stamp")
        journal = RunJournal(runtime.broker, namespace)

        async def ended() -> bool:
            events, _ = await journal.read(run_id)
            return bool(events) and isinstance(events[-1], RunCompleted)

        await eventually(ended, what="the tiny agent's run completed", timeout_s=30)
    assert stamped == [f"{run_id}:1", f"{run_id}:2"]


async def test_a_guest_event_that_names_no_agent_starts_the_registrys_default_agent(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    """The runtime assumes no agent of its own: an inbound event without `agent` (the field absent on the wire)
    is for the registry's default one, here the test's own agent."""

    async def stamp(args: dict[str, Any], key: str) -> dict[str, Any]:
        return {"stamped": args["n"]}

    registry = Registry.of(Registration(agent=TwoStamps(), tools=(Tool(STAMP, LocalOperation(stamp)),)))
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path)
    message = InboundMessage(event_id="evt-1", session_id="sess-1", guest_id="guest-1", text="stamp")
    run_id = run_id_for("", "evt-1")
    event = InboundEvent(
        key="evt-1",
        run_id=run_id,
        input_hash=inbound_hash(message, "two_stamps"),
        message=message,
        received_at=datetime.now(UTC),
    )
    wire = msgspec.json.decode(inbound_encoder.encode(event))
    del wire["agent"]
    async with (
        inprocess.runtime(settings, registry=registry) as runtime,
        inprocess.executor(settings, "stamps", registry=registry),
    ):
        await runtime.start()
        await broker.publish(namespace.inbound(run_id), msgspec.json.encode(wire), msg_id=run_id)
        journal = RunJournal(runtime.broker, namespace)

        async def ended() -> bool:
            events, _ = await journal.read(run_id)
            return bool(events) and isinstance(events[-1], RunCompleted)

        await eventually(ended, what="the default agent's run completed", timeout_s=30)
        events, _ = await journal.read(run_id)
    started = events[0]
    assert isinstance(started, RunStarted) and started.agent == "two_stamps"
