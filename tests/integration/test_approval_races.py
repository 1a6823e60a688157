"""Two managers deciding one approval at the same moment, on the real nats-server through two gateway
connections: the record moves from pending once (compare-and-set on its KV revision), exactly one decider is told
it decided, and every other is told who did. Every other approval test decides one after another, so a plain put
in place of the compare-and-set would pass them all."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.errors import ApprovalNotPending
from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.records import approval_records
from crashsafe.services.records.approval_records import ApprovalRecords, Stored
from tests.support import inprocess
from tests.support.nats_users import access

DECIDERS = 8  # four managers approving, four rejecting, at once, over two gateway replicas' connections


def _pending(approval_id: str) -> ApprovalRecord:
    now = datetime.now(UTC)
    return ApprovalRecord(
        approval_id=approval_id,
        run_id=run_id_for("acme", uuid.uuid4().hex),
        tenant="acme",
        guest_id="guest-1",
        session_id="sess-1",
        tool="create_payment",
        args={"booking_id": "bk_1", "amount_cents": 90_000},
        input_hash="a" * 64,
        amount_cents=90_000,
        currency="EUR",
        approver="manager",
        rule="approval_above",
        reason="over 500 EUR",
        requested_at=now,
        expires_at=now + timedelta(hours=1),
    )


async def test_concurrent_decisions_move_a_pending_approval_once_and_tell_every_loser_who_won(
    nats_server: NatsServer, broker: Broker, namespace: Namespace
) -> None:
    await provision(broker, namespace)
    settings = inprocess.settings_for(nats_server.url, namespace, worker_id="gateway")
    records = ApprovalRecords(broker, namespace)
    approval_id = f"apr_{uuid.uuid4().hex}"
    created = await records.create(_pending(approval_id))

    replicas = [
        await Broker.connect(nats_server.url, f"gateway-{n}", access=access(nats_server.url, Role.GATEWAY))
        for n in range(2)
    ]
    try:

        async def decide(n: int) -> Stored | ApprovalNotPending:
            decision = ApprovalStatus.APPROVED if n % 2 == 0 else ApprovalStatus.REJECTED
            try:
                return await approval_records.decide(
                    replicas[n % 2],
                    settings,
                    lambda tenant: tenant == "acme",
                    approval_id,
                    decision,
                    f"manager:m{n}",
                    f"decided by m{n}",
                )
            except ApprovalNotPending as lost:
                return lost

        answers = await asyncio.gather(*(decide(n) for n in range(DECIDERS)))
    finally:
        for replica in replicas:
            await replica.close()

    winners = [a for a in answers if isinstance(a, Stored)]
    assert len(winners) == 1, [a.record.decided_by for a in winners]
    (won,) = winners
    assert won.record.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
    assert won.revision > created.revision
    for lost in answers:
        if isinstance(lost, ApprovalNotPending):
            assert lost.details()["status"] == won.record.status
            assert lost.details()["decided_by"] == won.record.decided_by
    now = await records.get(approval_id)
    assert now is not None and now == won  # the record is the winner's, at the winner's revision
