"""The issue's NATS attack list, tried through our own Broker with each role's generated credentials against a
real nats-server: each is refused with a typed error and leaves nothing in the streams."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
import pytest

from crashsafe.contracts.errors import CrashsafeError, InvalidSetting, NotPermitted
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import leases_spec, projector_planner_consumer, stream_specs
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, OutcomeStatus, tool_encoder
from crashsafe.natsd import NatsAuth, NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess

NS = Namespace("attack")
FAMILIES = ("booking", "notify", "payment")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, NatsAuth]]:
    root = tmp_path_factory.mktemp("attack")
    auth = NatsAuth.for_deployment(root / "auth", NS, FAMILIES)
    server = NatsServer(root / "nats", auth=auth).start()
    yield server, auth
    server.stop()


@pytest.fixture
async def as_role(guarded: tuple[NatsServer, NatsAuth]) -> AsyncIterator[object]:
    server, auth = guarded
    opened: list[Broker] = []

    async def connect(role: Role, family: str | None = None) -> Broker:
        broker = await Broker.connect(
            server.url, f"attack-{role}", access=NatsAccess(creds=auth.creds(role, family))
        )
        opened.append(broker)
        return broker

    operator = await connect(Role.OPERATOR)
    for spec in stream_specs(NS):
        await operator.ensure_stream(spec)
    await operator.ensure_kv(leases_spec(NS))
    yield connect
    for broker in opened:
        await broker.close()


def _payment(amount: int) -> bytes:
    request = ActionRequest(
        run_id="r-victim",
        step_no=1,
        key=f"k-{uuid.uuid4().hex}",
        tool="create_payment",
        family="payment",
        args={"booking_id": "b1", "amount_cents": amount, "currency": "EUR"},
        input_hash="chosen",
        timeout_s=5.0,
        deadline_at=datetime.now(UTC),
        requested_at=datetime.now(UTC),
    )
    return tool_encoder.encode(request)


async def _count(operator: Broker, kind: StreamKind) -> int:
    info = await operator.js.stream_info(NS.stream(kind))
    return int(info.state.messages)


async def test_gateway_and_analytics_cannot_ask_for_a_payment(as_role) -> None:  # type: ignore[no-untyped-def]
    operator = await as_role(Role.OPERATOR)
    for role in (Role.GATEWAY, Role.ANALYTICS, Role.RECONCILER):
        broker = await as_role(role)
        with pytest.raises(NotPermitted) as refused:
            await broker.publish(NS.actions("payment", 0), _payment(999_99), timeout_s=5)
        assert refused.value.user == role.value
    # A refund of any payment, by an executor of another family: refused the same way.
    booking = await as_role(Role.EXECUTOR, "booking")
    with pytest.raises(NotPermitted):
        await booking.publish(NS.actions("payment", 1), _payment(-1), timeout_s=5)
    assert await _count(operator, StreamKind.ACTIONS) == 0


@pytest.mark.xfail(
    not NS.outcomes_all.endswith(">"),
    reason="needs slice C's outcome layout ({ns}.outcome.<family>.<run_id> on an OUTCOMES stream of outcome.>)",
    strict=True,
)
async def test_a_forged_outcome_from_the_wrong_family_is_refused(as_role) -> None:  # type: ignore[no-untyped-def]
    operator = await as_role(Role.OPERATOR)
    outcome = ActionOutcome(
        run_id="r-victim", step_no=2, key="k-pay", tool="create_payment", status=OutcomeStatus.SUCCEEDED
    )
    for role, family in ((Role.EXECUTOR, "booking"), (Role.GATEWAY, None), (Role.ANALYTICS, None)):
        broker = await as_role(role, family)
        with pytest.raises(NotPermitted):
            await broker.publish(
                f"{NS.name}.outcome.payment.r-victim", tool_encoder.encode(outcome), timeout_s=5
            )
        with pytest.raises(NotPermitted):
            await broker.publish(
                NS.run_event("r-victim", EventClass.STEP), b"{}", timeout_s=5
            )  # nor append to a journal
    payment = await as_role(Role.EXECUTOR, "payment")
    await payment.publish(f"{NS.name}.outcome.payment.r-victim", tool_encoder.encode(outcome), timeout_s=5)
    assert await _count(operator, StreamKind.OUTCOMES) == 1  # only the owning family's landed
    assert await _count(operator, StreamKind.RUNS) == 0


async def test_nobody_but_the_operator_purges_or_deletes_the_runs_stream(as_role) -> None:  # type: ignore[no-untyped-def]
    operator = await as_role(Role.OPERATOR)
    runtime = await as_role(Role.RUNTIME)
    await runtime.publish(NS.run_event("r1", EventClass.STEP), b"{}")
    for role, family in ((Role.ANALYTICS, None), (Role.RUNTIME, None), (Role.EXECUTOR, "payment")):
        broker = await as_role(role, family)
        js = broker.nc.jetstream(timeout=1)
        with pytest.raises(nats.errors.TimeoutError):  # refused: the API never sees the request
            await js.purge_stream(NS.stream(StreamKind.RUNS))
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(NS.stream(StreamKind.RUNS))
    assert await _count(operator, StreamKind.RUNS) == 1


async def test_a_client_without_credentials_or_with_a_bad_file_is_turned_away(
    guarded: tuple[NatsServer, NatsAuth], tmp_path: Path
) -> None:
    server, _ = guarded
    with pytest.raises(InvalidSetting) as anonymous:
        await Broker.connect(server.url, "anonymous", fail_fast=True)
    assert anonymous.value.variable == "CRASHSAFE_NATS_CREDS"
    bad = tmp_path / "bad.creds"
    bad.write_text("user: gateway\nseed: SUNOTAREALSEED\n")
    with pytest.raises(InvalidSetting) as garbled:
        await Broker.connect(server.url, "bad", fail_fast=True, access=NatsAccess(creds=bad))
    assert garbled.value.variable == "CRASHSAFE_NATS_CREDS"
    with pytest.raises(InvalidSetting):
        await Broker.connect(server.url, "gone", fail_fast=True, access=NatsAccess(creds=tmp_path / "gone"))


async def test_an_executor_cannot_roll_up_the_lease_bucket_to_wipe_another_familys_leases(as_role) -> None:  # type: ignore[no-untyped-def]
    """A `Nats-Rollup: all` header on a key an executor may write would purge every key of the bucket; no NATS
    permission sees headers, so the bucket itself refuses rollups."""
    operator = await as_role(Role.OPERATOR)
    leases = leases_spec(NS)
    await operator.kv_write(leases, NS.holder_key("payment", 0), b'{"store":"s1"}', revision=None)
    booking = await as_role(Role.EXECUTOR, "booking")
    with pytest.raises(CrashsafeError):
        await booking.publish(
            leases.subject(NS.lease_key("booking", 0)), b"{}", headers={"Nats-Rollup": "all"}, timeout_s=5
        )
    held = await operator.kv_get(leases, NS.holder_key("payment", 0))
    assert held is not None and held.value == b'{"store":"s1"}'


async def test_analytics_cannot_rewrite_the_projectors_durable_by_naming_it(as_role) -> None:  # type: ignore[no-untyped-def]
    """A create request whose *body* names an existing consumer updates it. Analytics may create consumers on
    RUNS, but the planner's durable is not its to touch: rewritten to a filter that matches nothing (or made
    ephemeral, to be deleted once idle) no run's end would reach the projector, and no email would be sent.
    Neither the bare (ephemeral) create subject nor the named one without a filter token may carry its name."""
    projector = await as_role(Role.PROJECTOR)
    planner = projector_planner_consumer(NS)
    await projector.ensure_consumer(planner)
    analytics = await as_role(Role.ANALYTICS)
    # Its config as the server holds it (consumer info is readable), with the filter and limits changed.
    seen = (await projector.js.consumer_info(planner.stream, planner.durable)).config.as_dict()
    config = {k: v for k, v in seen.items() if k != "durable_name"}
    config |= {"filter_subject": NS.run_events("nothing"), "max_ack_pending": 1}
    config |= {"inactive_threshold": 1_000_000_000}
    hostile = {"stream_name": planner.stream, "config": config}
    legacy = {"stream_name": planner.stream, "config": config | {"durable_name": "probe"}}
    for subject, body in (
        (f"$JS.API.CONSUMER.CREATE.{planner.stream}", hostile),
        (f"$JS.API.CONSUMER.CREATE.{planner.stream}.{planner.durable}", hostile),
        (f"$JS.API.CONSUMER.DURABLE.CREATE.{planner.stream}.probe", legacy),
        (f"$JS.API.CONSUMER.CREATE.{planner.stream}.probe", hostile),
    ):
        try:
            await analytics.nc.request(subject, json.dumps(body).encode(), timeout=1)
        except nats.errors.TimeoutError:
            pass  # refused: the API never sees the request (the others name their own consumer, not this one)
    info = await projector.js.consumer_info(planner.stream, planner.durable)
    assert info.config.filter_subject == planner.filter_subject
    assert info.config.durable_name == planner.durable
    assert info.config.max_ack_pending == planner.max_ack_pending
