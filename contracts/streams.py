"""Stream and consumer definitions as plain data; the platform adapter turns them into JetStream calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from crashsafe.contracts.subjects import Namespace, StreamKind

DUPLICATE_WINDOW_S = 120.0
DAY_S = 86_400.0
# How long a guest message stays in INBOUND: it can come again (be redelivered, be retried) only while it is there.
INBOUND_KEPT_S = 7 * DAY_S


class Retention(StrEnum):
    LIMITS = "limits"  # kept until its age or count limit
    WORK_QUEUE = "workqueue"  # removed once acknowledged


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Retention = Retention.LIMITS
    max_age_s: float = 0.0  # 0 = keep forever
    max_msgs_per_subject: int = -1
    discard_new_per_subject: bool = False
    duplicate_window_s: float = DUPLICATE_WINDOW_S
    allow_direct: bool = True
    replicas: int = 1
    # JetStream message scheduling (nats-server 2.12+; `Nats-Schedule: @at <RFC3339>` + `Nats-Schedule-Target`).
    allow_msg_schedules: bool = False
    # No message is ever deleted or purged through the API (the server's deny_delete and deny_purge): a witness.
    sealed: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subject: str
    ack_wait_s: float = 30.0
    max_deliver: int = 20
    max_ack_pending: int = 1000
    backoff_s: tuple[float, ...] = field(default=())
    # A pull consumer delivers only to a process that asks, for at most `pull_expires_s` per request: a paused
    # process stops asking, so it stops taking messages once its last request expires (a push queue group
    # would keep handing it half the redeliveries until the server noticed the dead connection, minutes on).
    pull: bool = False
    pull_expires_s: float = 2.0
    # A durable created on a stream with history starts this far back (by the server's receive time) instead of
    # at its first message; an existing durable keeps its place. None: from the first message.
    start_lookback_s: float | None = None

    @property
    def next_subject(self) -> str:
        """Where a pull consumer is asked for its next messages (the JetStream API's MSG.NEXT)."""
        return f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}"

    @property
    def deliver_subject(self) -> str | None:
        """Where a push consumer delivers; replicas share it through the deliver group named after the durable."""
        return None if self.pull else f"_deliver.{self.stream}.{self.durable}"


def stream_specs(ns: Namespace, replicas: int = 1) -> list[StreamSpec]:
    """The streams of a namespace. Production runs RUNS, ACTIONS and OUTCOMES with three replicas."""
    return [
        # One message per run subject, kept 7 days: a lasting guard on top of the 2-minute duplicate window.
        StreamSpec(
            name=ns.stream(StreamKind.INBOUND),
            subjects=(ns.inbound_all,),
            max_age_s=INBOUND_KEPT_S,
            max_msgs_per_subject=1,
            discard_new_per_subject=True,
            replicas=replicas,
        ),
        StreamSpec(name=ns.stream(StreamKind.RUNS), subjects=ns.run_subjects, replicas=replicas),
        StreamSpec(
            name=ns.stream(StreamKind.ACTIONS),
            subjects=(ns.actions_all,),
            retention=Retention.WORK_QUEUE,
            replicas=replicas,
        ),
        StreamSpec(
            name=ns.stream(StreamKind.OUTCOMES),
            subjects=(ns.outcomes_all,),
            retention=Retention.WORK_QUEUE,
            replicas=replicas,
        ),
        StreamSpec(
            name=ns.stream(StreamKind.DEAD_LETTERS),
            subjects=(ns.dead_letters_all,),
            max_age_s=30 * DAY_S,
            replicas=replicas,
        ),
        # Schedules wait here until they fire (an approval waits up to days); fired wakes are kept a while for
        # evidence. Limits retention: a schedule is removed by the server once it fired (`@at` is one-shot).
        StreamSpec(
            name=ns.stream(StreamKind.TIMERS),
            subjects=(ns.timers_all,),
            max_age_s=30 * DAY_S,
            allow_msg_schedules=True,
            replicas=replicas,
        ),
        support_spec(ns, replicas),
        # Planned projection tasks: removed once delivered (or dead); each tool's consumer filters its own.
        StreamSpec(
            name=ns.stream(StreamKind.PROJECTIONS),
            subjects=(ns.projections_all,),
            retention=Retention.WORK_QUEUE,
            replicas=replicas,
        ),
        StreamSpec(
            name=ns.stream(StreamKind.OPS), subjects=(ns.ops_all,), max_age_s=30 * DAY_S, replicas=replicas
        ),
        # Signed checkpoints of run heads (issue 34): kept forever (about 200 bytes a run), never deleted or
        # purged through the API, so rewriting one breaks every checkpoint after it (docs/evidence.md).
        StreamSpec(
            name=ns.stream(StreamKind.CHECKPOINTS), subjects=(ns.checkpoints,), sealed=True, replicas=replicas
        ),
    ]


def support_spec(ns: Namespace, replicas: int = 1) -> StreamSpec:
    """Support tickets, one per handed-off run's subject, kept forever; a second publish is refused (discard new
    per subject), so a ticket published by the runtime and again by the reconciler stands once."""
    return StreamSpec(
        name=ns.stream(StreamKind.SUPPORT),
        subjects=(ns.support_all,),
        max_msgs_per_subject=1,
        discard_new_per_subject=True,
        replicas=replicas,
    )


# How often the runtime takes a message before it gives up on it: past this, the message is dead-lettered (and
# counted, and logged as an error) by the runtime itself, never dropped by the server. Its consumers have no
# server-side `max_deliver`: the server's limit ends deliveries silently, with no dead letter and no alarm (a
# guest's accepted request was lost that way under a flood).
RUNTIME_MAX_DELIVER = 20
UNLIMITED = -1


def runtime_consumers(ns: Namespace, ack_wait_s: float = 30.0) -> list[ConsumerSpec]:
    """Pulled, not pushed: the runtime asks for as many messages as it has room for, so nothing waits in its
    client for a free handler (a push consumer's client dropped them as a slow consumer under a flood)."""
    return [
        ConsumerSpec(
            stream=ns.stream(StreamKind.INBOUND),
            durable=ns.runtime_inbound_consumer,
            filter_subject=ns.inbound_all,
            ack_wait_s=ack_wait_s,
            max_deliver=UNLIMITED,
            pull=True,
        ),
        ConsumerSpec(
            stream=ns.stream(StreamKind.OUTCOMES),
            durable=ns.runtime_outcomes_consumer,
            filter_subject=ns.outcomes_all,
            ack_wait_s=ack_wait_s,
            max_deliver=UNLIMITED,
            pull=True,
        ),
    ]


# How far back a journal-bus durable created on a journal with history starts: a receipt or an intent older than
# this was journaled before its durable existed (a namespace contracted long after its birth), and what asks for
# it now is the resolve path (a wake re-sends an unanswered request to the executor's ACTIONS durable).
BUS_LOOKBACK_S = 600.0


def receipts_consumer(ns: Namespace, ack_wait_s: float = 30.0) -> ConsumerSpec:
    """The runtime's durable on the receipts executors append to run journals: each wakes its run (issue 33)."""
    return ConsumerSpec(
        stream=ns.stream(StreamKind.RUNS),
        durable=ns.runtime_receipts_consumer,
        filter_subject=ns.run_receipts_all,
        ack_wait_s=ack_wait_s,
        max_deliver=UNLIMITED,
        pull=True,
        start_lookback_s=BUS_LOOKBACK_S,
    )


def timers_consumer(ns: Namespace, ack_wait_s: float = 30.0) -> ConsumerSpec:
    """The runtime's durable on fired timers: each one is a wake of its run (an approval's expiry)."""
    return ConsumerSpec(
        stream=ns.stream(StreamKind.TIMERS),
        durable=ns.runtime_timers_consumer,
        filter_subject=ns.timers_fired_all,
        ack_wait_s=ack_wait_s,
        max_deliver=UNLIMITED,
        pull=True,
    )


# How often an executor takes an action request before the server stops delivering it (0.1.0's value, declared by
# every release since: a durable's shape never changes in place). The executor settles a request itself before
# its last delivery (services/executor/service.py).
EXECUTOR_MAX_DELIVER = 12


def executor_consumer(
    ns: Namespace,
    family: str,
    partition: int,
    ack_wait_s: float = 30.0,
    max_deliver: int = EXECUTOR_MAX_DELIVER,
    lease_s: float = 5.0,
) -> ConsumerSpec:
    """A partition's consumer, pulled by its lease holder only. A pull request lives less than half a lease, so
    a holder paused past its lease has no request left on the server by the time another replica takes over."""
    return ConsumerSpec(
        stream=ns.stream(StreamKind.ACTIONS),
        durable=ns.executor_consumer(family, partition),
        filter_subject=ns.actions(family, partition),
        ack_wait_s=ack_wait_s,
        max_deliver=max_deliver,
        pull=True,
        pull_expires_s=max(min(lease_s / 2, 2.0), 0.2),
    )


def executor_journal_consumer(
    ns: Namespace,
    family: str,
    partition: int,
    ack_wait_s: float = 30.0,
    max_deliver: int = EXECUTOR_MAX_DELIVER,
    lease_s: float = 5.0,
) -> ConsumerSpec:
    """A partition's durable on the journal (issue 33): the intents runs journaled for it, pulled by its lease
    holder only, in the shape of its ACTIONS durable."""
    actions = executor_consumer(ns, family, partition, ack_wait_s, max_deliver, lease_s)
    return ConsumerSpec(
        stream=ns.stream(StreamKind.RUNS),
        durable=ns.executor_journal_consumer(family, partition),
        filter_subject=ns.run_intents_of(family, partition),
        ack_wait_s=actions.ack_wait_s,
        max_deliver=actions.max_deliver,
        pull=True,
        pull_expires_s=actions.pull_expires_s,
        start_lookback_s=BUS_LOOKBACK_S,
    )


# How far back the planner's durable starts when it is first created, and how long after its end the reconciler
# still checks a run's projections. A deployment upgraded to the projector has every run it ever had in RUNS
# (their emails sent as steps, or never): only runs that ended in the last hours are planned, well inside the
# day a receiver remembers a key (Stripe's, the sandbox's), so a step's email is answered by its key, never sent
# again. Enough to cover the gap between a deploy's new runtime and the projector's first start.
PLANNER_HISTORY_S = 6 * 3600.0


def projector_planner_consumer(
    ns: Namespace, ack_wait_s: float = 30.0, history_s: float = PLANNER_HISTORY_S
) -> ConsumerSpec:
    """The projector's durable on every run's milestones (`EventClass.MILESTONE`: a run's end, its wait on a
    person, its events after its end), which plan its projections; the server never sends it a step. Shared by
    the projector's replicas; a replica killed mid-plan leaves the event to redeliver."""
    return ConsumerSpec(
        stream=ns.stream(StreamKind.RUNS),
        durable=ns.projector_planner_consumer,
        filter_subject=ns.run_milestones_all,
        ack_wait_s=ack_wait_s,
        max_ack_pending=10_000,
        pull=True,
        start_lookback_s=history_s,
    )


def projection_consumer(ns: Namespace, tool: str, ack_wait_s: float = 30.0) -> ConsumerSpec:
    """One projection tool's durable: a pulled task is that worker's claim until acknowledged or its ack wait
    passes (renewed while a delivery is slow). The worker counts attempts and decides when a task is dead, so the
    server's own limit is only a backstop; a task waiting out its back-off is pending, hence the high ack limit."""
    return ConsumerSpec(
        stream=ns.stream(StreamKind.PROJECTIONS),
        durable=ns.projection_consumer(tool),
        filter_subject=ns.projections_of(tool),
        ack_wait_s=ack_wait_s,
        max_deliver=10_000,
        max_ack_pending=100_000,
        pull=True,
    )


@dataclass(frozen=True, slots=True)
class KvSpec:
    """A JetStream key-value bucket: one value per key (history 1 unless said), per-key TTLs allowed."""

    bucket: str
    replicas: int = 1
    history: int = 1  # how many values per key the bucket keeps (JetStream's limit is 64)

    @property
    def stream(self) -> str:
        return f"KV_{self.bucket}"

    def subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"


def leases_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Partition leases, holders and members of every executor family of a namespace."""
    return KvSpec(bucket=ns.leases_bucket, replicas=replicas)


def key_facts_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Per action key facts that must outlive a partition's store, `fact.<family>.<digest(key)>`: who asked first,
    the input hash, attempts, when the last call was sent, the receipt, and the compensation that undid it.
    Written by compare-and-set, fenced by the lease token of the partition's holder."""
    return KvSpec(bucket=ns.key_facts_bucket, replicas=replicas)


def clients_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """API client keys (hashed), `client.<key_id>`."""
    return KvSpec(bucket=ns.clients_bucket, replicas=replicas)


def active_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Active runs per guest and per session, `guest.<tenant>.<hash>` / `session.<tenant>.<hash>`; and the stall
    marks of runs whose agent held a runtime's loop, `stalled.<run_id>` (contracts/active.py)."""
    return KvSpec(bucket=ns.active_bucket, replicas=replicas)


def guests_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Guest profiles, `guest.<tenant>.<hash>`: one record per guest, rewritten by compare-and-set."""
    return KvSpec(bucket=ns.guests_bucket, replicas=replicas)


def approvals_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Approval records, `approval.<approval_id>`: created by the runtime, decided once by compare-and-set."""
    return KvSpec(bucket=ns.approvals_bucket, replicas=replicas)


def sessions_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Session lanes, `session.<tenant>.<hash>`: the run owning each session, fenced by the record's revision; and
    turn marks, `turn.<tenant>.<run_id>`: the run a message was handed to as a turn (kept while INBOUND keeps it)."""
    return KvSpec(bucket=ns.sessions_bucket, replicas=replicas)


# The catalog keeps this many published revisions: a run pinned to an older one meets CatalogRevisionGone.
CATALOG_HISTORY = 64


def catalog_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """The configuration catalog, key `catalog`; each revision is a KV revision runs pin (`catalog_revision`)."""
    return KvSpec(bucket=ns.catalog_bucket, replicas=replicas, history=CATALOG_HISTORY)


def projections_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Projection receipts, `projection.<tool>.<digest(key)>`: one `ProjectionRecord` per projection key."""
    return KvSpec(bucket=ns.projections_bucket, replicas=replicas)


def dead_marks_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Settled dead letters, `dead.<stream_seq>`: a `DeadLetterMark` (replayed or discarded), created once."""
    return KvSpec(bucket=ns.dead_letter_marks_bucket, replicas=replicas)


def versions_spec(ns: Namespace, replicas: int = 1) -> KvSpec:
    """Version heartbeats, `beat.<service>.<worker>`: a `VersionBeat` per live service process, each written with
    a TTL and renewed well within it, deleted on a clean stop (issue 30)."""
    return KvSpec(bucket=ns.versions_bucket, replicas=replicas)
