"""The run-scoped buckets stay bounded without taking a record from under a reader (issue 31, months of runs): each
write carries a TTL (the bucket's stream allows per-message TTLs), refreshed by the next write; an active-runs
record outlives the latest deadline it holds; an approval outlives its expiry while pending and goes a retention
after its decision; a key written without a TTL (a 0.2.0 process beside) is taken over by the next write. The real
nats-server, retention shortened to seconds."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from nats.js.api import StreamConfig

from crashsafe.contracts.active import ActiveRuns, active_encoder
from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.streams import KvSpec, active_spec, approvals_spec, sessions_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.approval_flow import decide
from crashsafe.domain.session_lanes import given_back
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records import active_runs
from crashsafe.services.records.approval_records import ApprovalRecords
from crashsafe.services.records.session_lane_records import SessionRecords
from tests.support import inprocess
from tests.support.waiting import eventually

SHORT = dataclasses.replace(RecordRetention(), sessions_s=2, active_s=1, approvals_s=1)


@pytest.fixture
async def short(nats_server: NatsServer, broker: Broker, namespace: Namespace) -> Broker:
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    broker.retention = SHORT
    return broker


async def _kept(broker: Broker, spec: KvSpec, key: str) -> bool:
    return await broker.kv_get(spec, key) is not None


async def test_a_session_lane_goes_a_retention_after_its_last_write_not_its_first(
    short: Broker, namespace: Namespace
) -> None:
    lanes = SessionRecords(short, namespace)
    key = namespace.session_key("acme", "s-1")
    assert await lanes.claim("acme", "s-1", "run_a", "g-1") == "run_a"
    await asyncio.sleep(1.2)
    await lanes.change("acme", "s-1", lambda lane: given_back(lane, "run_a"))  # a write: two seconds again
    await asyncio.sleep(1.2)
    assert await _kept(short, sessions_spec(namespace), key), (
        "expired 2 s after its first write, not its last"
    )
    await eventually(
        _gone(short, sessions_spec(namespace), key),
        what="the idle lane removed by its TTL",
        timeout_s=10,
    )
    # A lane gone is a free session: the next message claims it with a create, as on a new deployment.
    assert await lanes.claim("acme", "s-1", "run_b", "g-1") == "run_b"


def _gone(broker: Broker, spec: KvSpec, key: str) -> Callable[[], Awaitable[bool]]:
    async def gone() -> bool:
        return await broker.kv_get(spec, key) is None

    return gone


async def test_an_active_record_is_never_removed_while_it_counts_a_run(
    short: Broker, namespace: Namespace
) -> None:
    key = namespace.guest_active_key("acme", "g-1")
    until = datetime.now(UTC) + timedelta(seconds=3)
    await active_runs.claim(
        short,
        namespace,
        active_runs.Caps(per_guest=1),
        tenant="acme",
        guest_id="g-1",
        run_id="run_a",
        until=until,
    )
    await asyncio.sleep(2.5)  # well past its retention (1 s), not past the run's deadline
    entry = await short.kv_get(active_spec(namespace), key)
    assert entry is not None and "run_a" in entry.value.decode(), "a record counting a live run expired"
    await eventually(
        _gone(short, active_spec(namespace), key),
        what="the record removed a retention past its latest deadline",
        timeout_s=10,
    )


async def test_a_key_written_without_a_ttl_by_a_release_beside_is_taken_over_by_the_next_write(
    short: Broker, namespace: Namespace
) -> None:
    """0.2.0 writes its records with no TTL: they stay until this release writes them, and from then are bounded."""
    spec, key = active_spec(namespace), namespace.guest_active_key("acme", "g-2")
    revision = await short.kv_write(
        spec, key, active_encoder.encode(ActiveRuns()), revision=0
    )  # as 0.2.0 does
    await asyncio.sleep(1.5)
    assert await _kept(short, spec, key)
    until = datetime.now(UTC) + timedelta(seconds=1)
    await active_runs.claim(
        short,
        namespace,
        active_runs.Caps(per_guest=2),
        tenant="acme",
        guest_id="g-2",
        run_id="run_b",
        until=until,
    )
    assert (await short.kv_get(spec, key)).revision > revision  # type: ignore[union-attr]
    await eventually(_gone(short, spec, key), what="the taken-over key bounded", timeout_s=10)


def _approval(expires_at: datetime) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id="apr_ttl1",
        run_id="run_a",
        tenant="acme",
        guest_id="g-1",
        session_id="s-1",
        tool="charge_card",
        args={"amount_cents": 90_000},
        input_hash="h",
        approver="manager",
        rule="approval_above",
        reason="over the limit",
        requested_at=datetime.now(UTC),
        expires_at=expires_at,
    )


async def test_an_approval_outlives_its_expiry_while_pending_and_goes_after_its_decision(
    short: Broker, namespace: Namespace
) -> None:
    records = ApprovalRecords(short, namespace)
    spec, key = approvals_spec(namespace), namespace.approval_key("apr_ttl1")
    await records.create(_approval(datetime.now(UTC) + timedelta(seconds=3)))
    await asyncio.sleep(2.0)  # past the retention, not past its expiry: a manager may still decide it
    stored = await records.get("apr_ttl1")
    assert stored is not None and stored.record.status == ApprovalStatus.PENDING
    moved, ours = await records.move(
        "apr_ttl1", lambda r: decide(r, "approved", "manager:ann", "ok", datetime.now(UTC))
    )
    assert ours and moved is not None and moved.record.status == ApprovalStatus.APPROVED
    await eventually(_gone(short, spec, key), what="the decided approval removed", timeout_s=10)


async def test_a_bucket_made_without_per_message_ttls_is_given_them_in_place(broker: Broker) -> None:
    """Another client's bucket (no `allow_msg_ttl`) would refuse every write with a TTL: `infra apply` adds it, an
    additive change, and keeps what the bucket holds."""
    spec = KvSpec(bucket=f"ttl_{id(broker) % 100_000}")
    await broker.js.add_stream(
        StreamConfig(
            name=spec.stream, subjects=[spec.subject(">")], max_msgs_per_subject=1, allow_direct=True
        )
    )
    try:
        await broker.kv_write(spec, "kept", b"v", revision=None)
        await broker.ensure_kv(spec)
        assert (await broker.js.stream_info(spec.stream)).config.allow_msg_ttl
        assert await _kept(broker, spec, "kept")
        await broker.kv_write(spec, "brief", b"v", revision=None, ttl_s=1)
        await eventually(_gone(broker, spec, "brief"), what="a TTL honoured", timeout_s=10)
    finally:
        await broker.js.delete_stream(spec.stream)
