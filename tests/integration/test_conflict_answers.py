"""The business-key trap on the real nats-server, with real executors in front of the sandbox (issue 32, item 12).

A clinic's hold is keyed by guest, hotel and check-in; its check-out is an argument outside the identity. Asked
again for another check-out, the same key arrives with other input: one hold at the provider, and the conflict
the run journals (and its model is shown next) carries the hold the key already made. The executor tells it only
to a request naming the same account and guest: another tenant's request under the same key hears nothing of it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.keys import business_key, tool_input_hash
from crashsafe.contracts.run_events import ActionCompleted, JournalEvent
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    runtime_message_decoder,
)
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase
from crashsafe.domain.fold import replay
from crashsafe.domain.guest_scope import in_account
from crashsafe.domain.registry import HttpOperation, HttpRequest, Registration, Registry, Tool
from crashsafe.domain.run_state import RunState
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.waiting import eventually, unique
from tests.support.world import Sandbox

HOLD_ROOM = Tool(
    ToolContract(
        name="hold_room",
        family="booking",
        effect=Effect.WRITE,
        timeout_s=5.0,
        retry=RetryRule.KEYED,
        max_attempts=2,
        key_rule=KeyRule.BUSINESS,
        identity_kind="hold",
        identity=("guest_id", "hotel_id", "check_in"),
        # The trap, chosen: another check-out is the same hold.
        outside_identity=("check_out",),
        parameters={
            "type": "object",
            "properties": {k: {"type": "string"} for k in ("hotel_id", "check_in", "check_out")},
        },
    ),
    HttpOperation(
        request=lambda args: HttpRequest("POST", "/bookings", json=args),
        lookup_path="/bookings/by-key/{key}",
        ref_field="booking_id",
        requires=("hotel_id", "guest_id", "check_in", "check_out"),
    ),
)


class ClinicAgent(AgentBase):
    name = "clinic"
    tools = {HOLD_ROOM.name: HOLD_ROOM.contract}
    config = AgentConfig(agent="clinic")

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return in_account(state, dict(args) | {"guest_id": state.guest_id})


# A room held once per hotel and night for the whole tenant (the slot itself is the identity), whose agent names
# the guest in an argument of its own (`client`), not `guest_id`: nothing in the arguments tells two guests apart.
HOLD_NIGHT = Tool(
    msgspec.structs.replace(
        HOLD_ROOM.contract,
        name="hold_night",
        identity=("hotel_id", "check_in"),
        outside_identity=("check_out",),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST",
            "/bookings",
            json={k: v for k, v in args.items() if k != "client"} | {"guest_id": args["client"]},
        ),
        lookup_path="/bookings/by-key/{key}",
        ref_field="booking_id",
        requires=("hotel_id", "client", "check_in", "check_out"),
    ),
)


class FrontDeskAgent(AgentBase):
    name = "front_desk"
    tools = {HOLD_NIGHT.name: HOLD_NIGHT.contract}
    config = AgentConfig(agent="front_desk")

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return in_account(state, dict(args) | {"client": state.guest_id})


REGISTRY = Registry.of(
    Registration(agent=ClinicAgent(), tools=(HOLD_ROOM,)),
    Registration(agent=FrontDeskAgent(), tools=(HOLD_NIGHT,)),
)
STAY = {"hotel_id": "lis-1", "check_in": "2031-12-01"}


@dataclass
class World:
    broker: Broker
    ns: Namespace
    sandbox: Sandbox
    journal: RunJournal
    settings: Settings
    running: AsyncExitStack
    executor: Executor | None = None
    outcomes: list[ActionOutcome] = field(default_factory=list)

    async def ended(self, run_id: str) -> list[JournalEvent]:
        async def terminal() -> list[JournalEvent]:
            events, _ = await self.journal.read(run_id)
            state = replay(events) if events else None
            return events if state is not None and state.terminal else []

        return await eventually(terminal, what=f"run {run_id} to end")


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[World]:
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        http = await running.enter_async_context(httpx.AsyncClient(timeout=10))
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data", worker_id="rt"
        )
        here = World(
            broker, namespace, Sandbox(http, sandbox_url), RunJournal(broker, namespace), settings, running
        )

        async def collect(msg: Any) -> None:
            message = runtime_message_decoder.decode(msg.data)
            if isinstance(message, ActionOutcome):
                here.outcomes.append(message)

        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        running.push_async_callback(sub.unsubscribe)
        here.executor = await running.enter_async_context(
            inprocess.executor(settings, "booking", registry=REGISTRY)
        )
        yield here
    assert await dead_letters(broker, namespace) == []


async def test_another_check_out_for_the_same_hold_is_a_conflict_the_model_is_shown_the_hold_in(
    world: World,
) -> None:
    model = await world.running.enter_async_context(inprocess.scripted_model(world.settings))
    runtime = await world.running.enter_async_context(
        inprocess.runtime(world.settings, model, registry=REGISTRY)
    )
    await runtime.start()
    guest, tenant = unique("owner"), "clinic-1"

    async def asked(check_out: str) -> list[JournalEvent]:
        text = f"obey: hold_room {json.dumps(STAY | {'check_out': check_out})}"
        run_id = await submit_inbound(
            world.broker, world.ns, unique("ev"), agent="clinic", text=text, guest_id=guest, tenant=tenant
        )
        return await world.ended(run_id)

    first = await asked("2031-12-03")
    (held,) = [e for e in first if isinstance(e, ActionCompleted)]
    assert held.status == OutcomeStatus.SUCCEEDED and held.existing is None

    # A new conversation picks another check-out: the same key, other input.
    second = await asked("2031-12-04")
    (conflict,) = [e for e in second if isinstance(e, ActionCompleted)]
    assert (conflict.key, conflict.status) == (held.key, OutcomeStatus.CONFLICT)
    assert conflict.error is not None and conflict.error.code == "idempotency_conflict"
    assert conflict.existing is not None
    assert conflict.existing.provider_ref == held.provider_ref == held.result["booking_id"]
    assert conflict.existing.result == held.result
    # What the model was sent next: the conflict's tool output, with the hold it already has.
    state = replay(second)
    assert state is not None
    outputs = [json.loads(i["output"]) for i in state.transcript if i.get("type") == "function_call_output"]
    assert outputs == [
        {
            "error": msgspec.to_builtins(conflict.error),
            "status": "conflict",
            "existing": {"result": held.result, "provider_ref": held.provider_ref},
        }
    ]
    assert (await world.sandbox.counts(guest))["booking"] == 1


def _request(args: dict[str, Any], key: str) -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id="run_" + uuid.uuid4().hex[:24],
        step_no=1,
        tool="hold_room",
        family="booking",
        args=args,
        key=key,
        input_hash=tool_input_hash("hold_room", args),
        timeout_s=5.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )


async def test_another_tenants_request_under_the_same_key_hears_nothing_of_the_hold(world: World) -> None:
    """The tenant is in every business key's digest, so only a forged or colliding key gets here: the executor
    still shows the existing effect only to a request naming the first asker's account and guest."""
    guest = unique("owner")
    key = business_key("hold", "clinic-1", {"guest_id": guest, **STAY})
    mine = STAY | {"guest_id": guest, "account": "clinic-1"}
    first = _request(mine | {"check_out": "2031-12-03"}, key)
    assert world.executor is not None
    await inprocess.deliver(world.executor, first, 1)
    again = _request(mine | {"check_out": "2031-12-04"}, key)
    await inprocess.deliver(world.executor, again, 1)
    stranger = _request(mine | {"check_out": "2031-12-05", "account": "clinic-2"}, key)
    await inprocess.deliver(world.executor, stranger, 1)

    def answered() -> dict[str, ActionOutcome]:
        by_run = {o.run_id: o for o in world.outcomes if o.key == key}
        return by_run if len(by_run) == 3 else {}

    by_run = await eventually(answered, what="three outcomes")
    made = by_run[first.run_id]
    assert made.status == OutcomeStatus.SUCCEEDED and made.provider_ref
    own, other = by_run[again.run_id], by_run[stranger.run_id]
    assert own.status == other.status == OutcomeStatus.CONFLICT
    assert own.existing is not None and own.existing.provider_ref == made.provider_ref
    assert other.existing is None
    assert str(made.provider_ref) not in msgspec.json.encode(other).decode()
    assert (await world.sandbox.counts(guest))["booking"] == 1


async def test_another_guest_of_the_tenant_under_a_key_that_names_no_guest_hears_nothing_of_the_hold(
    world: World,
) -> None:
    """The executor tells `existing` to a request naming the first asker's guest; where the arguments name no
    `guest_id` at all it cannot tell two guests apart, so it tells nobody: another guest of the same clinic asking
    for the same night must not be shown the first guest's hold as its own."""
    model = await world.running.enter_async_context(inprocess.scripted_model(world.settings))
    runtime = await world.running.enter_async_context(
        inprocess.runtime(world.settings, model, registry=REGISTRY)
    )
    await runtime.start()
    tenant, night = "clinic-1", STAY

    async def asked(guest: str, check_out: str) -> list[JournalEvent]:
        text = f"obey: hold_night {json.dumps(night | {'check_out': check_out})}"
        run_id = await submit_inbound(
            world.broker, world.ns, unique("ev"), agent="front_desk", text=text, guest_id=guest, tenant=tenant
        )
        return await world.ended(run_id)

    first_guest, second_guest = unique("ana"), unique("bruno")
    (held,) = [e for e in await asked(first_guest, "2031-12-03") if isinstance(e, ActionCompleted)]
    assert held.status == OutcomeStatus.SUCCEEDED, held.error
    second = await asked(second_guest, "2031-12-04")
    (conflict,) = [e for e in second if isinstance(e, ActionCompleted)]
    assert (conflict.key, conflict.status) == (held.key, OutcomeStatus.CONFLICT)
    assert conflict.existing is None
    assert str(held.provider_ref) not in msgspec.json.encode(second).decode()
    assert first_guest not in msgspec.json.encode(second).decode()
