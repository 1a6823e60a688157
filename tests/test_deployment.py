"""A deployment decides which agents and tools run: a test composes its own, and the gateway admits no others."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from contracts.errors import ErrorInfo
from contracts.inbound import InboundEvent, InboundMessage, inbound_encoder
from contracts.keys import inbound_hash, run_id_for
from contracts.run_events import RunCompleted, ToolCall
from contracts.subjects import Namespace
from contracts.tools import Effect, RetryRule, ToolContract
from crashsafe.stack import Stack
from services.executor.service import Executor
from services.platform.jetstream import Broker
from services.platform.journal import RunJournal
from services.platform.natsd import NatsServer
from services.platform.providers import Providers
from services.platform.settings import Settings
from services.registry import LocalOperation, Registration, Registry, Tool
from services.runtime.core.agent import Compensation, ScriptedStep
from services.runtime.core.decide import ModelReply
from services.runtime.core.state import RunState
from services.runtime.service import Runtime
from tests.stackkit import eventually

STAMP = ToolContract(name="stamp", family="stamps", effect=Effect.WRITE, timeout_s=2.0, retry=RetryRule.KEYED)


class TwoStamps:
    """A tiny agent of the test's own: two keyed `stamp` steps from a plan, then a reply."""

    name = "two_stamps"
    instructions = ""
    tools = {STAMP.name: STAMP}
    compensation_tools: dict[str, ToolContract] = {}

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

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        return ()


class NoModel:
    async def answer(self, agent: Any, items: tuple[dict[str, Any], ...]) -> ModelReply:
        raise AssertionError("a plan agent never asks the model")


async def test_a_runtime_and_an_executor_composed_with_an_agent_of_the_tests_own(
    nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> None:
    stamped: list[str] = []

    async def stamp(args: dict[str, Any], key: str) -> dict[str, Any]:
        stamped.append(key)
        return {"stamped": args["n"]}

    registry = Registry.of(Registration(agent=TwoStamps(), tools=(Tool(STAMP, LocalOperation(stamp)),)))
    settings = Settings(nats_url=nats_server.url, namespace=namespace, data_dir=tmp_path, worker_id="test")
    broker = await Broker.connect(nats_server.url, "test-composition")
    providers = Providers(httpx.AsyncClient())
    runtime = Runtime(broker, settings, registry, NoModel(), logging.getLogger("test.runtime"))
    executor = Executor(broker, settings, registry, "stamps", providers, logging.getLogger("test.executor"))
    try:
        await runtime.start()
        await executor.start()
        message = InboundMessage(event_id="evt-1", session_id="s", guest_id="g", text="stamp")
        run_id = run_id_for(f"{namespace.name}:evt-1")
        event = InboundEvent(
            key=f"{namespace.name}:evt-1",
            run_id=run_id,
            input_hash=inbound_hash(message, "two_stamps"),
            message=message,
            agent="two_stamps",
            received_at=datetime.now(UTC),
        )
        await broker.publish(namespace.inbound(run_id), inbound_encoder.encode(event), msg_id=run_id)
        journal = RunJournal(broker, namespace)

        async def ended() -> bool:
            events, _ = await journal.read(run_id)
            return bool(events) and isinstance(events[-1], RunCompleted)

        await eventually(ended, what="the tiny agent's run completed", timeout_s=30)
        assert stamped == [f"{run_id}:1", f"{run_id}:2"]
    finally:
        await executor.close()
        await runtime.deliveries.drain()
        await providers.close()
        await broker.close()


async def test_the_gateway_admits_only_the_agents_the_deployment_registered(make_stack: Any) -> None:
    """`crashsafe up` runs the product's registry: the benchmark's `steps5` is refused, not left to hang."""
    stack: Stack = await asyncio.to_thread(make_stack, executors=(), reconciler=False)
    body = {"event_id": "evt-steps", "session_id": "s", "guest_id": "g", "text": "five steps"}
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as http:
        refused = await http.post("/v1/events?agent=steps5", json=body)
        assert refused.status_code == 422
        assert "steps5" in refused.json()["error"]["message"]
        assert "booking" in refused.json()["error"]["message"]
        accepted = await http.post("/v1/events", json=body)
        assert accepted.status_code == 202
