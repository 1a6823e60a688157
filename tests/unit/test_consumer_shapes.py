"""A live durable compared with its spec: every field that decides which messages a reader gets, or how, is its
shape (a release refuses to run on another); ack wait and ack limit are tuning (the server's is used)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from crashsafe.contracts.consumer_shapes import (
    ConsumerShape,
    FieldDifference,
    ShapeComparison,
    compare_consumer,
    declared_shape,
)
from crashsafe.contracts.errors import ConsumerShapeChanged
from crashsafe.contracts.streams import (
    ConsumerSpec,
    executor_consumer,
    projection_consumer,
    projector_planner_consumer,
    runtime_consumers,
    timers_consumer,
)
from crashsafe.contracts.subjects import Namespace

NS = Namespace("shapes")
INBOUND = runtime_consumers(NS)[0]
PLANNER = projector_planner_consumer(NS)
EVERY = [*runtime_consumers(NS), timers_consumer(NS), executor_consumer(NS, "payment", 2), PLANNER]


def found(spec: ConsumerSpec, **changed: object) -> ConsumerShape:
    """The durable as the server would hold it had `spec` made it, with `changed` fields."""
    return replace(declared_shape(spec), **changed)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", [*EVERY, projection_consumer(NS, "send_email")], ids=lambda s: s.durable)
def test_a_durable_as_its_spec_made_it_differs_in_nothing(spec: ConsumerSpec) -> None:
    assert compare_consumer(spec, found(spec)) == ShapeComparison()


# Each field that changes which messages a reader gets or how, with a value an older or newer release might have.
SHAPE_CHANGES: list[tuple[str, dict[str, object]]] = [
    ("filter_subjects", {"filter_subjects": ("shapes.inbound.>",)}),
    ("filter_subjects", {"filter_subjects": ()}),  # no filter: the whole stream
    ("filter_subjects", {"filter_subjects": ("shapes.inbound.*", "shapes.other.*")}),
    ("deliver_subject", {"deliver_subject": "_deliver.SHAPES_INBOUND.runtime_inbound"}),  # push, not pull
    ("deliver_group", {"deliver_group": "runtime_inbound"}),
    ("ack_policy", {"ack_policy": "none"}),
    ("ack_policy", {"ack_policy": "all"}),
    ("deliver_policy", {"deliver_policy": "by_start_sequence"}),
    ("deliver_policy", {"deliver_policy": "new"}),
    (
        "max_deliver",
        {"max_deliver": 20},
    ),  # the runtime counts deliveries itself: the server must not stop them
    ("backoff_s", {"backoff_s": (1.0, 5.0)}),
    ("headers_only", {"headers_only": True}),
]


@pytest.mark.parametrize(("field", "changed"), SHAPE_CHANGES, ids=lambda x: str(x))
def test_each_field_that_decides_what_a_reader_gets_is_its_shape(
    field: str, changed: dict[str, object]
) -> None:
    compared = compare_consumer(INBOUND, found(INBOUND, **changed))
    assert [d.field for d in compared.shape] == [field]
    assert compared.tuning == ()


def test_push_where_pull_is_declared_names_the_delivery_and_the_group() -> None:
    push = found(INBOUND, deliver_subject="_deliver.X.runtime_inbound", deliver_group="runtime_inbound")
    assert compare_consumer(INBOUND, push).shape == (
        FieldDifference("deliver_subject", "none (pull)", "_deliver.X.runtime_inbound (push)"),
        FieldDifference("deliver_group", "none", "runtime_inbound"),
    )


def test_pull_where_push_is_declared_is_another_shape_too() -> None:
    push_spec = replace(INBOUND, pull=False)
    pull = found(push_spec, deliver_subject=None, deliver_group=None)
    assert [d.field for d in compare_consumer(push_spec, pull).shape] == ["deliver_subject", "deliver_group"]


def test_ack_wait_and_ack_limit_are_tuning_used_as_the_server_has_them() -> None:
    compared = compare_consumer(INBOUND, found(INBOUND, ack_wait_s=1.0, max_ack_pending=50))
    assert compared.shape == ()
    assert compared.tuning == (
        FieldDifference("ack_wait_s", "30.0", "1.0"),
        FieldDifference("max_ack_pending", "1000", "50"),
    )


def test_durations_are_compared_to_the_millisecond() -> None:
    """The server keeps nanoseconds: 0.3 s may come back as 0.299999999."""
    spec = replace(INBOUND, ack_wait_s=0.3, backoff_s=(0.3, 1.1))
    held = found(spec, ack_wait_s=0.299999999, backoff_s=(0.299999999, 1.100000001))
    assert compare_consumer(spec, held) == ShapeComparison()


def test_a_durable_with_a_lookback_keeps_its_own_start() -> None:
    """The planner is made `start_lookback_s` back, or moved by an upgrade (a start sequence): any start will do,
    and nothing else is excused by it."""
    for policy in ("by_start_time", "by_start_sequence", "all"):
        assert compare_consumer(PLANNER, found(PLANNER, deliver_policy=policy)) == ShapeComparison()
    other = compare_consumer(PLANNER, found(PLANNER, deliver_policy="all", filter_subjects=("shapes.run.*",)))
    assert [d.field for d in other.shape] == ["filter_subjects"]


def test_several_differences_are_each_named() -> None:
    held = found(INBOUND, filter_subjects=("shapes.inbound.>",), max_deliver=5, ack_wait_s=2.0)
    compared = compare_consumer(INBOUND, held)
    assert [str(d) for d in compared.shape] == [
        "filter_subjects declared [shapes.inbound.*], found [shapes.inbound.>]",
        "max_deliver declared -1, found 5",
    ]
    assert [d.field for d in compared.tuning] == ["ack_wait_s"]


def test_the_error_names_the_durable_each_difference_and_what_to_do() -> None:
    compared = compare_consumer(INBOUND, found(INBOUND, filter_subjects=("shapes.inbound.>",)))
    error = ConsumerShapeChanged(
        stream=INBOUND.stream, durable=INBOUND.durable, differences=[str(d) for d in compared.shape]
    )
    assert error.details() == {
        "stream": "SHAPES_INBOUND",
        "durable": "runtime_inbound",
        "differences": ["filter_subjects declared [shapes.inbound.*], found [shapes.inbound.>]"],
    }
    assert "runtime_inbound on SHAPES_INBOUND" in error.message
    assert "new durable name" in error.message and "docs/upgrading.md" in error.message
