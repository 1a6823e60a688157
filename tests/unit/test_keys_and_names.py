"""Keys, subjects, streams and consumers (contracts/keys.py, subjects.py, streams.py) are named once and never drift.

A run id, an input hash or a partition computed by an older release must come out the same after an upgrade (a
redelivery must find its run, its key's store, and its hash to compare), so the values are pinned, not recomputed."""

from __future__ import annotations

from functools import partial

import pytest

from crashsafe.contracts.inbound import GuestMessage
from crashsafe.contracts.keys import inbound_hash, input_hash, is_run_id, partition_of, run_id_for
from crashsafe.contracts.streams import (
    Retention,
    StreamSpec,
    executor_consumer,
    projection_consumer,
    projections_spec,
    projector_planner_consumer,
    runtime_consumers,
    stream_specs,
)
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind

MESSAGE = GuestMessage(event_id="evt-1", session_id="s-1", guest_id="g-1", text="hi")


# Keys ---------------------------------------------------------------------------------------------------------


def test_a_run_id_is_derived_from_the_tenant_and_the_inbound_key_and_never_changes() -> None:
    assert run_id_for("acme", "evt-1") == "run_52d3190a321d3578e4388350"  # sha256("inbound:acme/evt-1")[:24]
    assert run_id_for("acme", "evt-1") != run_id_for("globex", "evt-1")  # two tenants' event ids never meet
    assert is_run_id(run_id_for("acme", "evt-1")) and is_run_id(run_id_for("acme", "x" * 200))
    assert not is_run_id("run_82d669b2bf3438bbe127796") and not is_run_id("run_*")


def test_an_input_hash_is_sha256_of_sorted_canonical_json() -> None:
    assert input_hash({"b": 1, "a": [2, "x"]}) == (
        "bbb8e7667558a86d3622dafcc40ea84605d1835a87b06ee47ea8adac48be8d7a"  # sha256(b'{"a":[2,"x"],"b":1}')
    )


def test_an_inbound_key_is_bound_to_the_message_and_the_agent() -> None:
    """The hash `run.started` keeps: the same key with another body or agent is a 409, never a second run."""
    assert (
        inbound_hash(MESSAGE, "booking") == "8c9ca16636e57dddf7c2da2f17fb1c3c044958d51b4936928d9e5797818cd6ff"
    )
    other_text = GuestMessage(event_id="evt-1", session_id="s-1", guest_id="g-1", text="hello")
    assert inbound_hash(other_text, "booking") != inbound_hash(MESSAGE, "booking")
    assert inbound_hash(MESSAGE, "steps5") != inbound_hash(MESSAGE, "booking")


def test_a_key_always_lands_on_the_same_partition() -> None:
    """Every delivery of a key reaches the one executor store that knows it: the mapping is part of the contract."""
    assert [partition_of(f"run_x:{step}", 4) for step in range(1, 9)] == [0, 3, 0, 3, 2, 1, 1, 0]
    assert partition_of("run_x:1", 1000) == 980
    assert partition_of("run_x:2", 1) == 0
    with pytest.raises(ValueError):
        partition_of("run_x:1", 0)


# Subjects and streams -----------------------------------------------------------------------------------------


def test_subjects_and_stream_names_of_a_namespace() -> None:
    ns = Namespace("stayhub")
    run = run_id_for("acme", "evt-1")

    assert [ns.stream(kind) for kind in StreamKind] == [
        "STAYHUB_INBOUND",
        "STAYHUB_RUNS",
        "STAYHUB_ACTIONS",
        "STAYHUB_OUTCOMES",
        "STAYHUB_DEAD_LETTERS",
        "STAYHUB_TIMERS",
        "STAYHUB_SUPPORT",
        "STAYHUB_PROJECTIONS",
        "STAYHUB_OPS",
        "STAYHUB_CHECKPOINTS",
    ]
    # Projections: a task per tool and run, its receipt per tool and key (the key digested: any text is a token).
    assert (
        ns.projection("send_confirmation_email", run) == f"stayhub.projection.send_confirmation_email.{run}"
    )
    assert (ns.projections_of("update_crm"), ns.projections_all) == (
        "stayhub.projection.update_crm.*",
        "stayhub.projection.>",
    )
    assert ns.projections_bucket == "stayhub_projections"
    record = ns.projection_record_key("record_audit", f"audit:{run}:12")
    assert record.startswith("projection.record_audit.") and "." not in record.removeprefix(
        "projection.record_audit."
    )
    assert ns.projection_record_key("record_audit", f"audit:{run}:12") == record
    assert ns.projection_record_key("record_audit", f"audit:{run}:13") != record
    assert (ns.ops("projection_failed", "update_crm"), ns.ops_all) == (
        "stayhub.ops.projection_failed.update_crm",
        "stayhub.ops.>",
    )
    assert ns.support("acme", run) == f"stayhub.support.acme.{run}"
    assert (ns.inbound(run), ns.run_events(run), ns.outcomes("payment", run), ns.wakes(run)) == (
        f"stayhub.inbound.{run}",
        f"stayhub.run.{run}.>",
        f"stayhub.outcome.payment.{run}",
        f"stayhub.outcome._wake.{run}",
    )
    assert ns.outcomes_all == "stayhub.outcome.>"
    # Where an outcome came from is where it arrived: the family token, or `_wake` for a wake-up.
    assert ns.outcome_source(ns.outcomes("payment", run)) == ("payment", run)
    assert ns.outcome_source(ns.wakes(run)) == ("_wake", run)
    assert ns.outcome_source(f"stayhub.outcome.{run}") is None
    assert ns.outcome_source(f"stayhub.outcome.payment.{run}.x") is None
    assert ns.outcome_source(f"other.outcome.payment.{run}") is None
    # A run's journal: a subject per event class, one filter across them (its version is checked on it).
    assert (ns.run_event(run, EventClass.STEP), ns.run_event(run, EventClass.MILESTONE)) == (
        f"stayhub.run.{run}.step",
        f"stayhub.run.{run}.milestone",
    )
    assert (ns.run_events_all, ns.run_milestones_all) == ("stayhub.run.*.>", "stayhub.run.*.milestone")
    # The journal as the bus: intents by family and partition, receipts by the family that wrote them.
    assert (ns.run_intent(run, "payment", 3), ns.run_intents_of("payment", 3)) == (
        f"stayhub.run.{run}.intent.payment.3",
        "stayhub.run.*.intent.payment.3",
    )
    assert ns.run_receipt(run, "payment") == f"stayhub.run.{run}.receipt.payment"
    assert ns.run_subjects == ("stayhub.run.*.*", "stayhub.run.*.intent.*.*", "stayhub.run.*.receipt.*")
    assert ns.receipt_writer(ns.run_receipt(run, "payment")) == "payment"
    for not_a_receipt in (
        ns.run_event(run, EventClass.STEP),
        ns.run_intent(run, "payment", 0),
        "other.run.x.receipt.p",
    ):
        assert ns.receipt_writer(not_a_receipt) is None
    for subject in (
        ns.run_event(run, "milestone"),
        ns.run_intent(run, "payment", 0),
        ns.run_receipt(run, "payment"),
    ):
        assert ns.journal_run(subject) == run
    with pytest.raises(ValueError):
        ns.run_receipt(run, "pay.ment")
    for stranger in (
        f"stayhub.run.{run}",
        f"stayhub.run.{run}.other",
        f"stayhub.run.{run}.intent.payment",
        f"stayhub.run.{run}.receipt.payment.0",
        f"other.run.{run}.step",
        "stayhub.run..step",
    ):
        assert ns.journal_run(stranger) is None
    assert ns.actions_for_key("payment", "run_x:3", 4) == "stayhub.action.payment.0"
    assert ns.actions_for_key("payment", "run_x:2", 4) == "stayhub.action.payment.3"
    assert Namespace().name == "crashsafe"


@pytest.mark.parametrize("token", ["*", ">", "run.x", "run x", ""])
def test_a_run_id_that_is_not_a_literal_token_never_reaches_a_subject(token: str) -> None:
    ns = Namespace()
    steps = partial(ns.run_event, kind=EventClass.STEP)
    for subject in (ns.inbound, ns.run_events, steps, ns.wakes, lambda run: ns.outcomes("payment", run)):
        with pytest.raises(ValueError):
            subject(token)


@pytest.mark.parametrize("family", ["_wake", "Payment", "pay.ment", "*", ""])
def test_a_family_that_is_not_a_name_never_reaches_an_outcome_subject(family: str) -> None:
    with pytest.raises(ValueError):
        Namespace().outcomes(family, run_id_for("", "evt-1"))


@pytest.mark.parametrize("name", ["", "Stayhub", "stay-hub", "1stayhub", "s" * 42])
def test_a_namespace_is_one_lower_case_token(name: str) -> None:
    with pytest.raises(ValueError):
        Namespace(name)


def test_the_streams_of_a_namespace() -> None:
    ns = Namespace("stayhub")
    day = 86_400.0

    assert stream_specs(ns, replicas=3) == [
        # One message per run subject, refused (not replaced) when taken, kept 7 days: the inbound guard.
        StreamSpec(
            name="STAYHUB_INBOUND",
            subjects=("stayhub.inbound.*",),
            max_age_s=7 * day,
            max_msgs_per_subject=1,
            discard_new_per_subject=True,
            replicas=3,
        ),
        StreamSpec(
            name="STAYHUB_RUNS",
            subjects=("stayhub.run.*.*", "stayhub.run.*.intent.*.*", "stayhub.run.*.receipt.*"),
            replicas=3,
        ),
        StreamSpec(
            name="STAYHUB_ACTIONS",
            subjects=("stayhub.action.>",),
            retention=Retention.WORK_QUEUE,
            replicas=3,
        ),
        StreamSpec(
            name="STAYHUB_OUTCOMES",
            subjects=("stayhub.outcome.>",),
            retention=Retention.WORK_QUEUE,
            replicas=3,
        ),
        StreamSpec(name="STAYHUB_DEAD_LETTERS", subjects=("stayhub.dead.*",), max_age_s=30 * day, replicas=3),
        # Schedules wait here for their time; the fired wakes go to `timer.fired.<run_id>` in the same stream.
        StreamSpec(
            name="STAYHUB_TIMERS",
            subjects=("stayhub.timer.>",),
            max_age_s=30 * day,
            allow_msg_schedules=True,
            replicas=3,
        ),
        # One ticket per handed-off run, kept forever; a second copy is refused, not stored.
        StreamSpec(
            name="STAYHUB_SUPPORT",
            subjects=("stayhub.support.>",),
            max_msgs_per_subject=1,
            discard_new_per_subject=True,
            replicas=3,
        ),
        # Projection tasks, removed once delivered or dead; each tool's worker consumes its own subjects.
        StreamSpec(
            name="STAYHUB_PROJECTIONS",
            subjects=("stayhub.projection.>",),
            retention=Retention.WORK_QUEUE,
            replicas=3,
        ),
        # Events for operators (a projection that gave up), kept 30 days like the dead letters.
        StreamSpec(name="STAYHUB_OPS", subjects=("stayhub.ops.>",), max_age_s=30 * day, replicas=3),
        # Kept forever, and no message deleted or purged through the API: the witness (issue 34).
        StreamSpec(
            name="STAYHUB_CHECKPOINTS", subjects=("stayhub.checkpoint.runs",), sealed=True, replicas=3
        ),
    ]
    assert {spec.replicas for spec in stream_specs(ns)} == {1}


def test_the_durable_consumers_a_deploy_resumes() -> None:
    """A durable renamed is a new consumer: every message would be delivered again from the start."""
    ns = Namespace("stayhub")

    inbound, outcomes = runtime_consumers(ns, ack_wait_s=1.0)
    assert (inbound.stream, inbound.durable, inbound.filter_subject, inbound.ack_wait_s) == (
        "STAYHUB_INBOUND",
        "runtime_inbound",
        "stayhub.inbound.*",
        1.0,
    )
    assert (outcomes.stream, outcomes.durable, outcomes.filter_subject, outcomes.ack_wait_s) == (
        "STAYHUB_OUTCOMES",
        "runtime_outcomes",
        "stayhub.outcome.>",
        1.0,
    )

    payment = executor_consumer(ns, "payment", 2, ack_wait_s=1.0, max_deliver=7)
    assert (
        payment.stream,
        payment.durable,
        payment.filter_subject,
        payment.ack_wait_s,
        payment.max_deliver,
    ) == (
        "STAYHUB_ACTIONS",
        "executor_payment_p2",
        "stayhub.action.payment.2",
        1.0,
        7,
    )
    # Pulled by the partition's lease holder only, each request living under half a lease.
    assert (payment.pull, payment.deliver_subject, payment.pull_expires_s) == (True, None, 2.0)
    assert executor_consumer(ns, "payment", 2, lease_s=1).pull_expires_s == 0.5

    # The projector's planner is sent only the runs' milestones, never a step; each projection tool has its own pulled durable, whose
    # worker decides when a task is dead (the server's max_deliver is only a backstop).
    planner = projector_planner_consumer(ns, ack_wait_s=1.0)
    assert (planner.stream, planner.durable, planner.filter_subject, planner.pull) == (
        "STAYHUB_RUNS",
        "projector_planner",
        "stayhub.run.*.milestone",
        True,
    )
    email = projection_consumer(ns, "send_confirmation_email", ack_wait_s=1.0)
    assert (email.stream, email.durable, email.filter_subject, email.pull, email.max_deliver) == (
        "STAYHUB_PROJECTIONS",
        "projection_send_confirmation_email",
        "stayhub.projection.send_confirmation_email.*",
        True,
        10_000,
    )
    assert projections_spec(ns).stream == "KV_stayhub_projections"
