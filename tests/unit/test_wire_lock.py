"""The broker-side contract, enforced: this tree runs beside the previous release on one broker, forward and back.

contracts/releases/<version>.json holds each release's wire lock as it shipped (`crashsafe.release_snapshot`);
`crashsafe.wire_lock.wire_breaks` names what this tree breaks of the previous one. The rules are tested one by one
on plain data below; the first tests run them against the real previous release.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from crashsafe import release_snapshot
from crashsafe.contracts.release import previous_release
from crashsafe.wire_lock import Wire, collide, covers, current, wire_breaks

pytestmark = pytest.mark.unit


def _previous() -> dict[str, Any]:
    release = previous_release()
    if release is None:
        pytest.skip("the first release runs beside nothing")
    snapshot = release_snapshot.previous()
    assert snapshot is not None, (
        f"contracts/releases/{release.version}.json is missing: snapshot the release from its own tree"
        " (crashsafe/release_snapshot.py says how)"
    )
    return snapshot


def test_the_previous_release_is_snapshotted_from_its_commit() -> None:
    release, snapshot = previous_release(), _previous()
    assert release and (snapshot["version"], snapshot["commit"]) == (release.version, release.commit)
    assert set(snapshot["wire"]) == set(current()), "the snapshot and today's extractor record other things"


def test_the_wire_breaks_nothing_the_previous_release_declared() -> None:
    snapshot = _previous()
    problems = wire_breaks(snapshot["wire"], current())
    assert not problems, (
        f"this tree would break release {snapshot['version']} running beside it on one broker (expand beside"
        " the old, contract a release later: contracts/README.md):\n" + "\n".join(problems)
    )


def test_the_extractor_reads_what_the_services_declare() -> None:
    wire = current()
    assert wire["consumers"]["runtime_outcomes"] == {
        "stream": "CRASHSAFE_OUTCOMES",
        "filter_subject": "crashsafe.outcome.>",
        "pull": True,
        "ack_policy": "explicit",
        "max_deliver": -1,
        "backoff_s": [],
        "deliver_policy": "all",
    }
    assert wire["consumers"]["projector_planner"]["deliver_policy"] == "by_start_time"
    assert {"executor_payment_p0", "projection_update_crm", "runtime_timers"} <= set(wire["consumers"])
    assert wire["streams"]["CRASHSAFE_TIMERS"]["allow_msg_schedules"] is True
    assert wire["buckets"]["crashsafe_catalog"] == {"history": 64}
    assert {"crashsafe.run.*.step", "crashsafe.run.*.milestone"} <= set(wire["publishes"]["runtime"])
    assert not [s for subjects in wire["publishes"].values() for s in subjects if s.startswith(("$JS", "_"))]
    assert wire["channels"]["run.started"] == ["crashsafe.run.*.*"]
    assert "run.wake" in wire["tags"] and "Nats-Msg-Id" in wire["headers"]


# The rules, on plain data ------------------------------------------------------------------------------------


def _wire() -> Wire:
    def stream(subjects: list[str], **limits: Any) -> dict[str, Any]:
        fixed = {"max_msgs_per_subject": -1, "discard_new_per_subject": False, "allow_msg_schedules": False}
        return {"subjects": subjects, "retention": "limits", "max_age_s": 0.0, **fixed, **limits}

    return {
        "namespace": "ns",
        "action_partitions": 4,
        "streams": {
            "NS_RUNS": stream(["ns.run.*.*"]),
            "NS_OUTCOMES": stream(["ns.outcome.>"], retention="workqueue"),
            "NS_INBOUND": stream(
                ["ns.inbound.*"], max_age_s=600.0, max_msgs_per_subject=1, discard_new_per_subject=True
            ),
        },
        "consumers": {
            "runtime_inbound": {
                "stream": "NS_INBOUND",
                "filter_subject": "ns.inbound.*",
                "pull": True,
                "ack_policy": "explicit",
                "max_deliver": -1,
                "backoff_s": [],
                "deliver_policy": "all",
            },
            "runtime_outcomes": {
                "stream": "NS_OUTCOMES",
                "filter_subject": "ns.outcome.>",
                "pull": True,
                "ack_policy": "explicit",
                "max_deliver": -1,
                "backoff_s": [],
                "deliver_policy": "all",
            },
        },
        "buckets": {"ns_leases": {"history": 1}},
        "publishes": {
            "runtime": ["$KV.ns_leases.lease.*", "ns.run.*.step"],
            "gateway": ["ns.inbound.*", "ns.provider_view.*"],  # a request, answered by a family's executors
        },
        "subscribes": {"executor-pay": ["ns.provider_view.pay"], "gateway": []},
        "channels": {"run.started": ["ns.run.*.*"], "inbound.guest_message": ["ns.inbound.*"]},
        "tags": ["inbound.guest_message", "run.started"],
        "headers": ["Nats-Msg-Id"],
    }


def _write(wire: Wire, subject: str) -> None:
    wire["publishes"]["runtime"].append(subject)


def _written_on(subjects: list[str]) -> Callable[[Wire], None]:
    def change(wire: Wire) -> None:
        wire["channels"]["run.started"] = subjects
        for subject in subjects:
            _write(wire, subject)

    return change


def _changed(change: Callable[[Wire], Any]) -> Wire:
    now = copy.deepcopy(_wire())
    change(now)
    return now


def _set(where: list[str], value: Any) -> Callable[[Wire], None]:
    def change(wire: Wire) -> None:
        target = wire
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value

    return change


def _rename_stream(wire: Wire) -> None:
    wire["streams"]["NS_JOURNAL"] = wire["streams"].pop("NS_RUNS")


def _rename_durable(wire: Wire) -> None:
    """A new durable name with a new shape, the old one no longer declared: how a consumer changes (starting where
    the old one is, not from the stream's first message)."""
    shape = {"max_deliver": 5, "deliver_policy": "by_start_time"}
    wire["consumers"]["runtime_inbound_v2"] = {**wire["consumers"].pop("runtime_inbound"), **shape}


def _take_over_from_the_start(wire: Wire) -> None:
    wire["consumers"]["runtime_inbound_v2"] = {**wire["consumers"]["runtime_inbound"], "max_deliver": 5}


def _responders_gone(wire: Wire) -> None:
    wire["subscribes"]["executor-pay"] = []


def _request_nobody_reads(wire: Wire) -> None:
    wire["publishes"]["gateway"].append(
        "ns.inbound.*.*"
    )  # moved off the stream's subjects: no stream takes it


def _request_only_new_responders_read(wire: Wire) -> None:
    wire["subscribes"]["executor-pay"].append("ns.refund_view.pay")
    wire["publishes"]["gateway"].append("ns.refund_view.*")


def _rename_work_queue_durable(wire: Wire) -> None:
    wire["consumers"]["runtime_outcomes_v2"] = wire["consumers"].pop("runtime_outcomes")


def _journal_token_added(wire: Wire) -> None:
    """The journal layout change of issue 19 done as one step: the stream takes the new subjects and the runtime
    writes them in the same release (an expand is the stream's subject alone; the writers follow a release later)."""
    wire["streams"]["NS_RUNS"]["subjects"].append("ns.run.*.*.*")
    wire["publishes"]["runtime"].append("ns.run.*.*.step")


RUNTIME_INBOUND = ["consumers", "runtime_inbound"]


def test_a_layout_only_read_is_expansion() -> None:
    """A release may declare a message's new subject before any role of it may publish there (issue 33's expand
    step: executors pull intents from the journal, runtimes take receipts from it); writing it is the next's."""
    now = _changed(lambda w: w["channels"]["run.started"].append("ns.run.*.intent.*.*"))
    assert not [p for p in wire_breaks(_wire(), now) if p.startswith("message ")]
    then = _changed(
        lambda w: (
            w["channels"]["run.started"].append("ns.run.*.intent.*.*"),
            _write(w, "ns.run.*.intent.pay.*"),
        )
    )
    assert wire_breaks(now, then) == [p for p in wire_breaks(now, then) if not p.startswith("message ")]
    assert any(
        p.startswith("message run.started: now travels on ns.run.*.intent")
        for p in wire_breaks(_wire(), then)
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda w: w["streams"].pop("NS_RUNS"), "stream NS_RUNS: removed or renamed"),
        (_rename_stream, "stream NS_RUNS: removed or renamed"),
        (
            _set(["streams", "NS_RUNS", "subjects"], ["ns.run.*.step"]),
            "stream NS_RUNS: no longer takes ns.run.*.*",
        ),
        (
            _set(["streams", "NS_RUNS", "retention"], "workqueue"),
            "stream NS_RUNS: retention changed from limits to workqueue",
        ),
        (
            _set(["streams", "NS_INBOUND", "max_msgs_per_subject"], 2),
            "stream NS_INBOUND: max_msgs_per_subject changed from 1 to 2",
        ),
        (
            _set(["streams", "NS_INBOUND", "discard_new_per_subject"], False),
            "stream NS_INBOUND: discard_new_per_subject changed from True to False",
        ),
        (
            _set(["streams", "NS_RUNS", "allow_msg_schedules"], True),
            "stream NS_RUNS: allow_msg_schedules changed from False to True",
        ),
        (_set(["streams", "NS_INBOUND", "max_age_s"], 60.0), "stream NS_INBOUND: keeps messages for less"),
        (_set(["streams", "NS_RUNS", "max_age_s"], 86400.0), "stream NS_RUNS: keeps messages for less"),
        (
            _set([*RUNTIME_INBOUND, "max_deliver"], 20),
            "consumer runtime_inbound: redefined in place (max_deliver",
        ),
        (
            _set([*RUNTIME_INBOUND, "pull"], False),
            "consumer runtime_inbound: redefined in place (pull True to",
        ),
        (
            _set([*RUNTIME_INBOUND, "ack_policy"], "none"),
            "consumer runtime_inbound: redefined in place (ack_pol",
        ),
        (
            _set([*RUNTIME_INBOUND, "backoff_s"], [1.0]),
            "consumer runtime_inbound: redefined in place (backoff_s",
        ),
        (
            _set([*RUNTIME_INBOUND, "stream"], "NS_RUNS"),
            "consumer runtime_inbound: redefined in place (stream",
        ),
        (
            _set([*RUNTIME_INBOUND, "filter_subject"], "ns.inbound.>"),
            "consumer runtime_inbound: redefined in place (filter_subject ns.inbound.* to ns.inbound.>)",
        ),
        (
            _set([*RUNTIME_INBOUND, "deliver_policy"], "by_start_time"),
            "consumer runtime_inbound: redefined in place (deliver_policy all to by_start_time)",
        ),
        (lambda w: w["buckets"].pop("ns_leases"), "bucket ns_leases: removed"),
        (_set(["buckets", "ns_leases", "history"], 0), "bucket ns_leases: history shrunk from 1 to 0"),
        (
            _journal_token_added,
            "role runtime publishes ns.run.*.*.step into NS_RUNS, which the previous release's NS_RUNS does not",
        ),
        (
            _written_on(["ns.run.*.*.*"]),
            "message run.started: now travels on ns.run.*.*.*, where the previous release never carried it",
        ),
        (
            lambda w: (w["channels"]["run.started"].append("ns.journal.*"), _write(w, "ns.journal.*")),
            "message run.started: now travels on ns.journal.*",
        ),
        (_set(["tags"], ["inbound.guest_message"]), "message type run.started: removed"),
        (_set(["headers"], []), "header Nats-Msg-Id: removed"),
        (_set(["namespace"], "other"), "the locks describe two namespaces (ns, other)"),
        (_set(["action_partitions"], 8), "the action partitions changed from 4 to 8"),
        (
            _take_over_from_the_start,
            "consumer runtime_inbound_v2: takes over runtime_inbound's filter on NS_INBOUND from the stream's first",
        ),
        (
            _responders_gone,
            "role gateway of the previous release sends ns.provider_view.*, which no role subscribes to now",
        ),
        (
            _request_nobody_reads,
            "role gateway publishes ns.inbound.*.*, which no stream or bucket takes and no role subscribes to:",
        ),
        (
            _request_only_new_responders_read,
            "role gateway publishes ns.refund_view.*, which no stream or bucket takes and no role of the previous",
        ),
        (
            _rename_work_queue_durable,
            "consumer runtime_outcomes_v2: new on work-queue stream NS_OUTCOMES, its filter overlapping "
            "runtime_outcomes's",
        ),
    ],
    ids=[
        "stream_removed",
        "stream_renamed",
        "subject_dropped",
        "retention",
        "per_subject_limit",
        "discard_new_per_subject",
        "schedules",
        "kept_less",
        "forever_to_a_day",
        "max_deliver",
        "pull_to_push",
        "ack_policy",
        "backoff",
        "consumer_stream",
        "filter",
        "deliver_policy",
        "bucket_removed",
        "history_shrunk",
        "new_writer_on_an_old_stream",
        "channel_moved",
        "channel_added",
        "tag_removed",
        "header_removed",
        "namespace",
        "partitions",
        "take_over_from_the_start",
        "responders_gone",
        "request_nobody_reads",
        "request_only_new_responders_read",
        "work_queue_reader_renamed",
    ],
)
def test_a_wire_break_is_named(change: Callable[[Wire], Any], says: str) -> None:
    problems = wire_breaks(_wire(), _changed(change))
    named = [p for p in problems if p.startswith(says)]
    assert len(named) == 1, problems
    # Beside the break itself, only the writers it leaves refused (one more sentence, tested below).
    assert all(p.startswith("role ") for p in problems if p not in named), problems


def test_a_stream_removed_names_the_writers_it_leaves_refused() -> None:
    """Both releases' writers: the previous one's refused, this one's still publishing into nothing."""
    problems = wire_breaks(_wire(), _changed(lambda w: w["streams"].pop("NS_RUNS")))
    assert problems == [
        "stream NS_RUNS: removed or renamed (a stream stays until a contract release; a new one goes beside it)",
        "role runtime of the previous release publishes ns.run.*.step, which no stream or bucket takes now: its"
        " writes would be refused (a subject stays taken until a contract release)",
        "role runtime publishes ns.run.*.step, which no stream or bucket takes and no role subscribes to: what it"
        " sends is lost; a new request subject is answered a release before it is sent",
    ]
    dropped = wire_breaks(_wire(), _changed(lambda w: w["buckets"].pop("ns_leases")))
    assert [p.split(":")[0] for p in dropped] == [
        "bucket ns_leases",
        "role runtime of the previous release publishes $KV.ns_leases.lease.*, which no stream or bucket takes now",
        "role runtime publishes $KV.ns_leases.lease.*, which no stream or bucket takes and no role subscribes to",
    ]


def _expanded(wire: Wire) -> None:
    """Everything a release may add beside the previous one's wire."""
    wire["streams"]["NS_RUNS"]["subjects"] = ["ns.run.>"]  # widened: still takes every old subject
    wire["streams"]["NS_INBOUND"]["max_age_s"] = 6000.0  # kept longer
    wire["streams"]["NS_OPS"] = {**wire["streams"]["NS_RUNS"], "subjects": ["ns.ops.>"]}
    _rename_durable(wire)
    wire["consumers"]["runtime_inbound"] = _wire()["consumers"]["runtime_inbound"]  # still declared beside it
    wire["consumers"]["runtime_inbound"]["ack_wait_s"] = (
        1.0  # tuning recorded by a later extractor: not compared
    )
    wire["buckets"]["ns_leases"]["history"] = 5
    wire["buckets"]["ns_versions"] = {"history": 1}
    wire["publishes"]["runtime"] += [
        "$KV.ns_versions.beat.runtime.*",
        "ns.ops.runtime",
        "ns.provider_view.pay",
    ]
    wire["subscribes"]["executor-crm"] = [
        "ns.provider_view.crm",
        "ns.refund_view.crm",
    ]  # read before it is asked
    wire["publishes"]["projector"] = ["ns.run.*.milestone", "ns.ops.projector"]  # a new role, on old subjects
    wire["channels"]["run.started"].append("ns.run.*.step")  # narrower than where it travelled
    wire["channels"]["run.nudged"] = ["ns.run.*.*"]
    wire["tags"].append("run.nudged")
    wire["headers"].append("Crashsafe-Version")


def test_additions_break_nothing() -> None:
    assert wire_breaks(_wire(), _wire()) == []
    assert wire_breaks(_wire(), _changed(_expanded)) == []


def test_a_durable_no_longer_declared_is_left_for_the_contract_step() -> None:
    assert wire_breaks(_wire(), _changed(lambda w: w["consumers"].clear())) == []
    assert wire_breaks(_wire(), _changed(_rename_durable)) == []


def test_a_new_writer_on_a_new_stream_or_off_the_streams_is_expansion() -> None:
    """Only a subject written into a stream the previous release had must be one it took: a new stream or bucket
    is neither read nor provisioned by the previous release, and a request is read by whoever subscribes."""

    def change(wire: Wire) -> None:
        wire["streams"]["NS_JOURNAL"] = {**wire["streams"]["NS_RUNS"], "subjects": ["ns.journal.*.*"]}
        wire["publishes"]["runtime"] += ["ns.journal.*.step", "$KV.ns_versions.beat.*"]
        wire["buckets"]["ns_versions"] = {"history": 1}

    assert wire_breaks(_wire(), _changed(change)) == []
    assert len(wire_breaks(_wire(), _changed(_journal_token_added))) == 1
    # A request a role of each release answers.
    assert (
        wire_breaks(_wire(), _changed(lambda w: w["publishes"]["runtime"].append("ns.provider_view.pay")))
        == []
    )


def test_a_new_reader_of_a_work_queue_takes_new_subjects() -> None:
    """Two durables may read one subject of a limits stream, never of a work queue (the server refuses the second)."""

    def reader(filter_subject: str) -> Callable[[Wire], None]:
        def change(wire: Wire) -> None:
            wire["consumers"]["executor_crm"] = {
                **wire["consumers"]["runtime_outcomes"],
                "filter_subject": filter_subject,
            }

        return change

    assert wire_breaks(_wire(), _changed(reader("ns.crm.*"))) == []
    assert len(wire_breaks(_wire(), _changed(reader("ns.outcome.crm.*")))) == 1
    limits = _changed(_set(["streams", "NS_OUTCOMES", "retention"], "limits"))
    beside = copy.deepcopy(limits)
    reader("ns.outcome.crm.*")(beside)
    assert wire_breaks(limits, beside) == [] and len(beside["consumers"]) == 3
    # Another stream's reader shares nothing with these, whatever its filter spells.
    elsewhere = _changed(reader("ns.outcome.>"))
    elsewhere["consumers"]["executor_crm"]["stream"] = "NS_RUNS"
    assert wire_breaks(_wire(), elsewhere) == []


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("ns.outcome.>", "ns.outcome.crm.*", True),
        ("ns.outcome.*.x", "ns.outcome.crm.*", True),
        ("ns.outcome.*", "ns.outcome.crm.*", False),
        ("ns.outcome.>", "ns.outcome", False),
        ("ns.action.a.0", "ns.action.a.1", False),
        ("ns.action.a.0", "ns.action.a.0", True),
        ("ns.action.*.0", "ns.action.a.>", True),
    ],
)
def test_collide_is_subject_overlap(a: str, b: str, expected: bool) -> None:
    assert collide(a, b) is expected and collide(b, a) is expected


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("ns.run.*.*", "ns.run.*.step", True),
        ("ns.run.*.*", "ns.run.*.*", True),
        ("ns.run.>", "ns.run.*.*", True),
        ("ns.run.>", "ns.run.x", True),
        ("ns.run.>", "ns.run.>", True),
        ("ns.run.>", "ns.run", False),
        ("ns.run.*", "ns.run.*.*", False),
        ("ns.run.*.*", "ns.run.*", False),
        ("ns.run.*.step", "ns.run.*.*", False),
        ("ns.run.*.*", "ns.run.>", False),
        ("ns.run.*", "ns.run.>", False),
        ("ns.run.x", "ns.run.y", False),
        ("$KV.ns_a.>", "$KV.ns_a.lease.*", True),
        ("$KV.ns_a.>", "$KV.ns_b.lease.*", False),
    ],
)
def test_covers_is_subject_containment(wide: str, narrow: str, expected: bool) -> None:
    assert covers(wide, narrow) is expected


def test_a_snapshot_checks_the_message_lock_too() -> None:
    """A release's message lock is checked from its snapshot: a lock.json rewritten by hand hides nothing."""
    locked = {"run.example": {"run_id": {"type": "str", "required": True}}}
    snapshot = {"version": "9.9.9", "wire": _wire(), "messages": locked}
    assert release_snapshot.breaks(snapshot, _wire(), locked) == []
    assert release_snapshot.breaks(snapshot, _changed(lambda w: w["headers"].clear()), {}) == [
        "against 9.9.9: header Nats-Msg-Id: removed (header names only grow: the previous release still sends and"
        " reads it)",
        "against 9.9.9: run.example: the message type was removed (a type is kept forever)",
    ]
