"""The support queue on the real nats-server, with each role's own NATS user: one ticket per handed-off run,
however many times the runtime and the reconciler's backstop publish it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import Budget, HandOffReason, RunHandedOff, RunStarted
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.support import support_decoder, ticket_for
from crashsafe.domain.handoff import handoff_reply
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.reconciler.service import Reconciler
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.support_tickets import publish_ticket
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.waiting import eventually, unique

TENANT = "acme"


@pytest.fixture
async def reconciler(
    nats_server: NatsServer, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[Reconciler]:
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="s")
    async with inprocess.reconciler(settings) as worker:
        yield worker


@pytest.fixture
async def runtime_broker(nats_server: NatsServer) -> AsyncIterator[Broker]:
    """A connection with the runtime's own NATS user: what the runtime may publish, and nothing more."""
    b = await Broker.connect(nats_server.url, "tests-runtime", access=access(nats_server.url, Role.RUNTIME))
    yield b
    await b.close()


async def handed_off_run(journal: RunJournal) -> tuple[RunStarted, RunHandedOff]:
    key = unique("ev")
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id_for(TENANT, key),
        at=now,
        agent="booking",
        session_id=f"s-{key}",
        guest_id=f"g-{key}",
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text="Book a room",
        budget=Budget(),
        deadline_at=now + timedelta(seconds=90),
        tenant=TENANT,
    )
    handed = RunHandedOff(
        run_id=started.run_id,
        at=now,
        reason=HandOffReason.LOOP,
        detail="same search 4 times",
        reply=handoff_reply(HandOffReason.LOOP),
    )
    seq = await journal.append(started, 0)
    await journal.append(handed, seq)
    return started, handed


async def stored_tickets(broker: Broker, ns: Namespace, run_id: str) -> list[bytes]:
    stored = await broker.read_subject(ns.stream(StreamKind.SUPPORT), ns.support(TENANT, run_id))
    return [m.data for m in stored]


async def test_the_reconciler_publishes_a_ticket_the_runtime_never_did(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    started, handed = await handed_off_run(RunJournal(broker, namespace))
    await eventually(
        lambda: started.run_id in reconciler.work.tickets, what="the reconciler to see the hand-off"
    )
    await reconciler.tick(handed.at + timedelta(seconds=reconciler.grace_s + 1))

    (data,) = await stored_tickets(broker, namespace, started.run_id)
    ticket = support_decoder.decode(data)
    assert ticket == ticket_for(
        handed, tenant=TENANT, agent="booking", guest_id=started.guest_id, session_id=started.session_id
    )
    assert started.run_id not in reconciler.work.tickets  # made sure of: not published again


async def test_a_ticket_published_by_the_runtime_and_again_by_the_reconciler_stands_once(
    reconciler: Reconciler, broker: Broker, runtime_broker: Broker, namespace: Namespace
) -> None:
    started, handed = await handed_off_run(RunJournal(broker, namespace))
    ticket = ticket_for(
        handed, tenant=TENANT, agent="booking", guest_id=started.guest_id, session_id=started.session_id
    )
    log = logging.getLogger("tests.support")
    assert await publish_ticket(runtime_broker, namespace, ticket, log)
    assert await publish_ticket(runtime_broker, namespace, ticket, log)  # a retry: still the one ticket
    await eventually(
        lambda: started.run_id in reconciler.work.tickets, what="the reconciler to see the hand-off"
    )
    await reconciler.tick(handed.at + timedelta(seconds=reconciler.grace_s + 1))
    assert started.run_id not in reconciler.work.tickets

    tickets = await stored_tickets(broker, namespace, started.run_id)
    assert [support_decoder.decode(t) for t in tickets] == [ticket]
