"""The key that started a run never decides its approvals, an admin key included (`crashsafe up` mints one admin
key, which both starts runs and may decide): the run records its starting key, and the gateway refuses that key's
decision. A run started by a release that recorded no key keeps the scope rule alone (issue 31, item 9)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.inbound import inbound_decoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import ApprovalRequested, RunStarted, ToolCall
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.approval_flow import new_record
from crashsafe.domain.call_plan import approval_id_for
from crashsafe.domain.fold import fold_run
from crashsafe.domain.intake import addressed, run_started
from crashsafe.domain.registry import Registry, load
from crashsafe.natsd import NatsServer
from crashsafe.services.gateway import app as gateway
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.approval_records import ApprovalRecords
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.stack import auth_header, guest_event

pytestmark = pytest.mark.integration

_started = msgspec.json.Decoder(RunStarted)


async def _held(broker: Broker, ns: Namespace, run_id: str, registry: Registry, *, legacy: bool) -> str:
    """Journal the run as the runtime starts it from its inbound message (`legacy`: as a release that recorded
    no starting key wrote it), and an approval it asks for; the record the runtime makes. Its approval id."""
    inbound = await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(run_id))
    assert inbound is not None
    event = addressed(inbound_decoder.decode(inbound.data), registry.default_agent)
    now = datetime.now(UTC)
    config = registry.agent(event.agent).config
    started = run_started(event, now, revision=0, config=config, profile=None, history=[])
    if legacy:
        raw = msgspec.json.decode(msgspec.json.encode(started))
        raw.pop("started_by", None)
        started = _started.decode(msgspec.json.encode(raw))
    seq = await RunJournal(broker, ns).append(started, 0)
    call = ToolCall(call_id="call_pay", name="create_payment", arguments='{"booking_id": "bk_1"}')
    held = ApprovalRequested(
        run_id=run_id,
        at=now,
        step_no=2,
        approval_id=approval_id_for(run_id, 2),
        call=call,
        tool="create_payment",
        args={"booking_id": "bk_1", "amount_cents": 240_000, "currency": "EUR"},
        input_hash="h" * 64,
        amount_cents=240_000,
        currency="EUR",
        approver="manager",
        rule="corporate_approval",
        reason="a manager's approval is needed",
        expires_at=now + timedelta(hours=1),
    )
    await RunJournal(broker, ns).append(held, seq)
    await ApprovalRecords(broker, ns).create(new_record(fold_run(fold_run(None, started), held), held))
    return held.approval_id


# The app's handlers name their path parameters in the style this Litestar warns about when the app is built.
@pytest.mark.filterwarnings("ignore::litestar.exceptions.LitestarDeprecationWarning")
async def test_the_admin_key_that_started_a_run_may_not_approve_it_another_admin_may(
    nats_server: NatsServer, namespace: Namespace, broker: Broker
) -> None:
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace), nats_access=access(nats_server.url, Role.GATEWAY)
    )
    await inprocess.provisioned(settings)
    keys = ClientKeys(broker, namespace)
    starter = (await keys.create("acme", [Scope.ADMIN], name="crashsafe up")).key
    manager = (await keys.create("acme", [Scope.ADMIN], name="another admin")).key
    registry = load(settings.registry)
    app = gateway.build_app(settings, registry)
    decision = {"decision": "approve", "approver": "ana"}
    async with AsyncTestClient(app=app, raise_server_exceptions=False) as client:
        ids = []
        for _ in range(2):
            started = await client.post("/v1/events", json=guest_event(), headers=auth_header(starter))
            assert started.status_code == 202, started.text
            ids.append(started.json()["run_id"])
        own = await _held(broker, namespace, ids[0], registry, legacy=False)
        old = await _held(broker, namespace, ids[1], registry, legacy=True)

        refused = await client.post(f"/v1/approvals/{own}", json=decision, headers=auth_header(starter))
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "forbidden" and ids[0] in error["message"], error
        assert (await ApprovalRecords(broker, namespace).get(own)).record.status == "pending"  # type: ignore[union-attr]

        approved = await client.post(f"/v1/approvals/{own}", json=decision, headers=auth_header(manager))
        assert approved.status_code == 200 and approved.json()["status"] == "approved", approved.text
        # A run started by a release that recorded no key: who started it is not known, the scope rule decides.
        legacy = await client.post(f"/v1/approvals/{old}", json=decision, headers=auth_header(starter))
        assert legacy.status_code == 200, legacy.text
