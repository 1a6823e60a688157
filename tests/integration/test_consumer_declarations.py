"""Declaring a durable or a stream on a broker another release shares (issue 30), on a real nats-server: a missing
durable is made; a live one is never deleted or redefined in place. One of another shape (an older release's push
consumer, another filter) is left exactly as it was and the declaring service refuses with ConsumerShapeChanged;
one of other tuning is used as the server has it, said once. A stream keeps every subject it takes and its
retention."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from crashsafe.contracts.errors import ConsumerShapeChanged, StreamShapeChanged
from crashsafe.contracts.streams import (
    ConsumerSpec,
    Retention,
    StreamSpec,
    projector_planner_consumer,
    runtime_consumers,
    stream_specs,
)
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_declarations import _consumer_config
from tests.support.broker import ensure_streams


async def _as_it_is(broker: Broker, spec: ConsumerSpec) -> tuple[object, ConsumerConfig]:
    """When the durable was made and its config: both the same later, it was neither recreated nor updated."""
    info = await broker.js.consumer_info(spec.stream, spec.durable)
    return info.created, info.config


async def test_a_missing_durable_is_made_and_declaring_it_again_changes_nothing(
    broker: Broker, namespace: Namespace
) -> None:
    await ensure_streams(broker, namespace)
    inbound = runtime_consumers(namespace)[0]
    await broker.ensure_consumer(inbound)
    made = await _as_it_is(broker, inbound)
    assert made[1].filter_subject == inbound.filter_subject and made[1].deliver_subject is None
    await broker.ensure_consumer(inbound)
    # The previous release declares it with nats-py's add_consumer (create or update): the same shape, accepted.
    await broker.js.add_consumer(inbound.stream, _consumer_config(inbound))
    assert await _as_it_is(broker, inbound) == made


@pytest.mark.parametrize("kind", ["inbound", "outcomes"])
async def test_an_older_releases_push_durable_is_left_as_it_is_and_the_pull_declaration_refused(
    broker: Broker, namespace: Namespace, kind: str
) -> None:
    """The issue's first failure: a release made `runtime_inbound` / `runtime_outcomes` pull where a live older
    runtime read them pushed, by deleting them (on the work-queue OUTCOMES stream the re-add then failed, and no
    runtime consumer was left). Now nothing is touched: the new runtime refuses, naming what differs."""
    await ensure_streams(broker, namespace)
    spec = dict(zip(("inbound", "outcomes"), runtime_consumers(namespace), strict=True))[kind]
    older = replace(spec, pull=False)
    await broker.ensure_consumer(older)
    await broker.publish(namespace.inbound("run_1") if kind == "inbound" else namespace.wakes("run_1"), b"{}")
    before = await _as_it_is(broker, spec)

    with pytest.raises(ConsumerShapeChanged) as refused:
        await broker.ensure_consumer(spec)

    assert (refused.value.stream, refused.value.durable) == (spec.stream, spec.durable)
    assert refused.value.differences == [
        f"deliver_subject declared none (pull), found {older.deliver_subject} (push)",
        f"deliver_group declared none, found {spec.durable}",
    ]
    assert await _as_it_is(broker, spec) == before
    info = await broker.js.consumer_info(spec.stream, spec.durable)
    assert info.num_pending == 1  # its message still waits for the older release's reader


async def test_a_durable_with_another_filter_is_refused_and_left_as_it_is(
    broker: Broker, namespace: Namespace
) -> None:
    await ensure_streams(broker, namespace)
    planner = projector_planner_consumer(namespace)
    older = replace(planner, filter_subject=namespace.run_events_all, start_lookback_s=None)
    await broker.ensure_consumer(older)
    before = await _as_it_is(broker, planner)
    with pytest.raises(ConsumerShapeChanged) as refused:
        await broker.ensure_consumer(planner)
    assert refused.value.differences == [
        f"filter_subjects declared [{planner.filter_subject}], found [{namespace.run_events_all}]"
    ]
    assert await _as_it_is(broker, planner) == before


async def test_other_tuning_is_used_as_the_server_has_it_and_said_once(
    broker: Broker, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    await ensure_streams(broker, namespace)
    inbound = runtime_consumers(namespace, ack_wait_s=5.0)[0]
    await broker.ensure_consumer(inbound)
    before = await _as_it_is(broker, inbound)
    caplog.set_level(logging.WARNING, logger="crashsafe.jetstream")
    declared_again = replace(inbound, ack_wait_s=1.0, max_ack_pending=10)
    await broker.ensure_consumer(declared_again)
    await broker.ensure_consumer(declared_again)
    assert await _as_it_is(broker, inbound) == before  # ack wait still 5 s: the server's consumer as it is
    told = [r.getMessage() for r in caplog.records if inbound.durable in r.getMessage()]
    assert len(told) == 1, told
    assert (
        "ack_wait_s declared 1.0, found 5.0" in told[0]
        and "max_ack_pending declared 10, found 1000" in told[0]
    )


async def test_a_new_durable_with_a_lookback_starts_back_and_an_existing_one_keeps_its_start(
    broker: Broker, namespace: Namespace
) -> None:
    """The planner is made `start_lookback_s` back; one an upgrade moved to a start sequence keeps it."""
    await ensure_streams(broker, namespace)
    planner = projector_planner_consumer(namespace)
    await broker.ensure_consumer(planner)
    made = (await broker.js.consumer_info(planner.stream, planner.durable)).config
    assert made.deliver_policy == DeliverPolicy.BY_START_TIME and made.opt_start_time is not None

    await broker.js.delete_consumer(planner.stream, planner.durable)
    await broker.start_consumer_at(planner, 1)
    moved = await _as_it_is(broker, planner)
    await broker.ensure_consumer(planner)
    assert await _as_it_is(broker, planner) == moved
    assert moved[1].deliver_policy == DeliverPolicy.BY_START_SEQUENCE


async def test_a_stream_keeps_the_subjects_it_takes_and_refuses_another_retention(
    broker: Broker, namespace: Namespace
) -> None:
    runs = next(s for s in stream_specs(namespace) if s.name == namespace.stream(StreamKind.RUNS))
    await broker.ensure_stream(replace(runs, subjects=(namespace.legacy_run_events_all,)))
    await broker.ensure_stream(runs)
    assert await broker.stream_subjects(runs.name) == [
        *namespace.run_subjects,
        namespace.legacy_run_events_all,
    ]

    queue = StreamSpec(name=f"{namespace.name.upper()}_QUEUE", subjects=(f"{namespace.name}.q.>",))
    await broker.ensure_stream(queue)
    with pytest.raises(StreamShapeChanged) as refused:
        await broker.ensure_stream(replace(queue, retention=Retention.WORK_QUEUE))
    assert refused.value.differences == ["retention declared workqueue, found limits"]
    info = await broker.js.stream_info(queue.name)
    assert info.config.retention == "limits"
