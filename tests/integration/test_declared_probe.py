"""A registry's own probe on the real nats-server (issue 32, item 13): a registry that is not StayHub's declares a
read-only probe; the synthetic tenant's turn to the agent `synthetic` runs its reads through the runtime, the model
port's fixed route and the executor, and the judge passes it. The reconciler's cadence takes the probe from the
registry's agents, where it used to be "off" for any registry but StayHub's."""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AsyncExitStack
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.run_events import ActionRequested, JournalEvent
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT, SYNTHETIC_TENANT, SyntheticResult
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase
from crashsafe.domain.fold import replay
from crashsafe.domain.probe import Probe, ProbeCall
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.reconciler.synthetic_cadence import SyntheticCadence
from crashsafe.services.reconciler.synthetic_probe import judge
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.waiting import eventually, unique

# A family the tests' NATS users cover for a test's own registry (tests/conftest.py, TEST_ONLY_FAMILIES).
FAMILY = "orders"
ASKED: list[dict[str, Any]] = []


async def _slots(args: dict[str, Any], key: str) -> dict[str, Any]:
    ASKED.append(dict(args))
    return {"slots": [{"slot_id": "s-0900", "day": args.get("day")}]}


async def _hold(args: dict[str, Any], key: str) -> dict[str, Any]:
    raise AssertionError("a probe never holds")


FIND_SLOTS = Tool(
    ToolContract(
        name="find_slots",
        family=FAMILY,
        effect=Effect.READ,
        timeout_s=2.0,
        retry=RetryRule.RETRY,
        key_rule=KeyRule.NONE,
        parameters={"type": "object", "properties": {"day": {"type": "string"}}},
    ),
    LocalOperation(_slots),
    audited=False,
)
HOLD_SLOT = Tool(
    ToolContract(name="hold_slot", family=FAMILY, effect=Effect.WRITE, timeout_s=2.0, retry=RetryRule.KEYED),
    LocalOperation(_hold),
    audited=False,
)


class ClinicAgent(AgentBase):
    name = "clinic"
    tools = {FIND_SLOTS.name: FIND_SLOTS.contract, HOLD_SLOT.name: HOLD_SLOT.contract}
    config = AgentConfig(agent="clinic")


PROBE = Probe(
    agent="clinic",
    calls=(ProbeCall("find_slots", lambda today: {"day": (today + timedelta(days=30)).isoformat()}),),
    budget_s=20.0,
)
REGISTRY = Registry.of(Registration(agent=ClinicAgent(), tools=(FIND_SLOTS, HOLD_SLOT)), probe=PROBE)


@pytest.fixture
def settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Settings:
    return inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="rt")


async def test_a_non_stayhub_registrys_probe_runs_its_reads_end_to_end_and_passes(
    settings: Settings, broker: Broker, namespace: Namespace
) -> None:
    async with AsyncExitStack() as running:
        await running.enter_async_context(inprocess.executor(settings, FAMILY, registry=REGISTRY))
        model = await running.enter_async_context(inprocess.scripted_model(settings))
        runtime = await running.enter_async_context(inprocess.runtime(settings, model, registry=REGISTRY))
        await runtime.start()
        today = datetime.now(UTC).date()
        run_id = await submit_inbound(
            broker,
            namespace,
            unique("synthetic"),
            agent=SYNTHETIC_AGENT,
            text=PROBE.text(today),
            guest_id="synthetic-probe",
            tenant=SYNTHETIC_TENANT,
        )
        journal = RunJournal(broker, namespace)

        async def ended() -> list[JournalEvent]:
            events, _ = await journal.read(run_id)
            state = replay(events) if events else None
            return events if state is not None and state.terminal else []

        events = await eventually(ended, what=f"probe run {run_id} to end")
    result, why = judge([msgspec.to_builtins(e) for e in events], PROBE)
    assert result == SyntheticResult.OK, why
    assert [e.tool for e in events if isinstance(e, ActionRequested)] == ["find_slots"]
    assert {"day": (today + timedelta(days=30)).isoformat()} in ASKED
    assert await dead_letters(broker, namespace) == []


def test_the_cadence_takes_the_registrys_declared_probe(settings: Settings) -> None:
    on = dataclasses.replace(
        settings,
        synthetic_gateway_url="http://gateway:8080",
        synthetic_key_file=Path("/k"),
        synthetic_every_s=60.0,
    )
    cadence = SyntheticCadence.configured(None, on, logging.getLogger("tests"), agents=REGISTRY.agents)  # type: ignore[arg-type]
    assert cadence is not None and cadence.probe is PROBE
    assert PROBE.text(date(2031, 5, 1)).startswith("synthetic probe ")
