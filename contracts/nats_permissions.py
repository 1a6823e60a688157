"""Who may publish and subscribe what on NATS: one user per service role, least privilege, as plain data.

The server's configuration (services/platform/nats_users.py), the permission table in docs/security.md and the
sweep test all read `users()`; nothing else spells a role's subjects. Every JetStream API subject used here is
listed in docs/security.md with what it does (read from nats-server's server/jetstream_api.go).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from crashsafe.contracts.archive_permissions import archiver
from crashsafe.contracts.jetstream_api import API, DESTRUCTIVE, direct_get, own_consumer, stream_info
from crashsafe.contracts.memory import MEMORY_FAMILY
from crashsafe.contracts.permission_scope import Scope
from crashsafe.contracts.streams import (
    executor_consumer,
    executor_journal_consumer,
    projector_planner_consumer,
    receipts_consumer,
    runtime_consumers,
    timers_consumer,
)
from crashsafe.contracts.subjects import (
    DEFAULT_ACTION_PARTITIONS,
    WAKE_TOKEN,
    EventClass,
    Namespace,
    StreamKind,
)

# The buckets slice A adds beside the leases (`{ns}_clients`: API keys; `{ns}_active`: active runs per guest).
CLIENTS = "clients"
ACTIVE = "active"
GUESTS = "guests"  # guest profiles: the runtime reads them, the memory executor alone writes them
APPROVALS = "approvals"  # approval records and session lanes (issue 9)
SESSIONS = "sessions"
KEY_FACTS = "key_facts"  # an action key's facts beside its store (issue 17): its family's executors
CATALOG = "catalog"  # the configuration catalog: the operator publishes, runtimes read and watch
PROJECTIONS = "projections"  # receipts and run plans (issue 10): the projector writes, the reconciler reads
DEAD_MARKS = "dead_marks"  # dead letters an operator replayed or discarded (issue 11): the gateway, the CLI
VERSIONS = "versions"  # version heartbeats (issue 30): each service its own `beat.<user>.*`


class Role(StrEnum):
    """A NATS user's role; an executor's user name carries its family (`executor-payment`)."""

    GATEWAY = "gateway"
    RUNTIME = "runtime"
    EXECUTOR = "executor"
    RECONCILER = "reconciler"
    # The CLI: provisions streams and buckets, manages keys, reads, reconciles; an admin.
    OPERATOR = "operator"
    # An outside reader of the RUNS stream: its own consumers, direct gets, nothing else.
    ANALYTICS = "analytics"
    PROJECTOR = "projector"  # plans projections from run journals and delivers them (issue 10)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    # May answer a request it received (publish once to that request's reply subject, for a short time), as the
    # executors answer the gateway's provider views; nothing else of the asker's inbox.
    allow_responses: bool = False


@dataclass(frozen=True, slots=True)
class NatsUser:
    name: str
    role: Role
    family: str | None
    permissions: Permissions

    @property
    def inbox_prefix(self) -> str:
        """Replies to this user (PubAcks, direct gets, pull deliveries) come here; no other user may listen."""
        return inbox_prefix(self.name)


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


def user_name(role: Role, family: str | None = None) -> str:
    return f"{role.value}-{family}" if role is Role.EXECUTOR else role.value


def _user(
    role: Role,
    publish: Iterable[str],
    subscribe: Iterable[str] = (),
    family: str | None = None,
    deny: Iterable[str] = (),
    responses: bool = False,
) -> NatsUser:
    name = user_name(role, family)
    deny = () if role is Role.OPERATOR else (*DESTRUCTIVE, *deny)
    return NatsUser(
        name=name,
        role=role,
        family=family,
        permissions=Permissions(
            publish=tuple(dict.fromkeys(publish)),
            subscribe=(f"{inbox_prefix(name)}.>", *dict.fromkeys(subscribe)),
            publish_deny=deny,
            allow_responses=responses,
        ),
    )


def users(
    ns: Namespace | None, families: Iterable[str], partitions: int = DEFAULT_ACTION_PARTITIONS
) -> list[NatsUser]:
    """Every user of a deployment: its namespace (None: any), its registry's tool families and partitions."""
    s = Scope(ns)
    n = s.n
    families = sorted(set(families))
    all_streams = [s.stream(k) for k in StreamKind]
    runs, inbound = s.stream(StreamKind.RUNS), s.stream(StreamKind.INBOUND)
    support = s.stream(StreamKind.SUPPORT)
    tickets = f"{n}.support.*.*"  # one ticket per handed-off run: `{ns}.support.{tenant}.{run_id}`
    wakes = f"{n}.outcome.{WAKE_TOKEN}.*"
    concrete = ns or Namespace()
    inbound_consumer, outcomes_consumer = (s.consumer(c) for c in runtime_consumers(concrete))
    timers = s.consumer(timers_consumer(concrete))
    # The runtime's outcome consumer covers every family's outcomes and the wakes (`{ns}.outcome.>`).
    outcomes_consumer = replace(outcomes_consumer, filter_subject=f"{n}.outcome.>")

    gateway = _user(
        Role.GATEWAY,
        [
            f"{n}.inbound.*",
            wakes,  # its reconcile endpoint wakes a run; the runtime re-sends what the run still needs
            s.kv(ACTIVE, ">"),
            # A manager's decision (compare-and-set on the record) and the session lane a new message claims.
            s.kv(APPROVALS, "approval.*"),
            s.kv(SESSIONS, "session.*.*"),
            *(stream_info(x) for x in all_streams),
            stream_info(s.kv_stream(CLIENTS)),
            stream_info(s.kv_stream(ACTIVE)),
            stream_info(s.kv_stream(APPROVALS)),
            stream_info(s.kv_stream(SESSIONS)),
            *direct_get(inbound),
            *direct_get(runs),
            *direct_get(s.stream(StreamKind.CHECKPOINTS)),  # a run's evidence (the console's download)
            *direct_get(s.kv_stream(CLIENTS)),
            *direct_get(s.kv_stream(ACTIVE)),
            *direct_get(s.kv_stream(APPROVALS)),
            *direct_get(s.kv_stream(SESSIONS)),
            *_operating(s),
            # The console's run page shows the run's projection receipts: read only, never written.
            stream_info(s.kv_stream(PROJECTIONS)),
            *direct_get(s.kv_stream(PROJECTIONS)),
        ],
    )
    runtime = _user(
        Role.RUNTIME,
        [
            *(f"{n}.run.*.{kind.value}" for kind in EventClass),  # only the runtime appends to journals
            *(f"{n}.action.{f}.*" for f in families),  # and only it asks executors to act: on ACTIONS,
            *(f"{n}.run.*.intent.{f}.*" for f in families),  # or in the journal, as the bus (issue 33)
            f"{n}.dead.runtime",
            f"{n}.checkpoint.runs",  # its signed checkpoints of run heads (issue 34), after the last one read
            wakes,  # the deadline of a run waiting on actions wakes it, on whichever replica takes it
            tickets,  # a handed-off run's support ticket
            s.kv(ACTIVE, ">"),
            # Approval records (created, decided by the guest's answer or the expiry), session lanes (released,
            # claimed for a turn whose run had ended) and turn marks, and the approval expiry schedules (never the
            # fired subjects: only the server's scheduler writes those).
            s.kv(APPROVALS, "approval.*"),
            *(s.kv(SESSIONS, f"{keys}.*.*") for keys in ("session", "turn")),
            f"{n}.timer.approval.*",
            f"{n}.timer.cancelled.*",  # purges a decided approval's schedule (`Nats-Schedule-Next: purge`)
            *(stream_info(x) for x in all_streams),
            stream_info(s.kv_stream(ACTIVE)),
            stream_info(s.kv_stream(APPROVALS)),
            stream_info(s.kv_stream(SESSIONS)),
            *own_consumer(inbound_consumer),
            *own_consumer(outcomes_consumer),
            *own_consumer(timers),
            *own_consumer(s.consumer(receipts_consumer(concrete))),
            *direct_get(runs),
            *direct_get(s.stream(StreamKind.CHECKPOINTS)),
            *direct_get(s.kv_stream(ACTIVE)),
            stream_info(s.kv_stream(GUESTS)),
            *direct_get(s.kv_stream(GUESTS)),
            *direct_get(s.kv_stream(APPROVALS)),
            *direct_get(s.kv_stream(SESSIONS)),
            *direct_get(s.stream(StreamKind.TIMERS)),
            # The catalog: read (a pinned revision by sequence) and watched (an ordered consumer), never written.
            stream_info(s.kv_stream(CATALOG)),
            *direct_get(s.kv_stream(CATALOG)),
            f"{API}.CONSUMER.CREATE.{s.kv_stream(CATALOG)}",
            f"$JS.FC.{s.kv_stream(CATALOG)}.>",
        ],
        # Pulled (contracts/streams.py): what it is sent arrives on its own inbox, nothing to subscribe to beyond.
    )
    executors = []
    for family in families:
        consumers = [
            s.consumer(feed(concrete, family, p))
            for p in range(partitions)
            for feed in (executor_consumer, executor_journal_consumer)
        ]
        executors.append(
            _user(
                Role.EXECUTOR,
                [
                    f"{n}.outcome.{family}.*",  # outcomes of its own family only
                    f"{n}.run.*.receipt.{family}",  # its receipts into the journals, on its own subject only
                    f"{n}.dead.executor_{family}",
                    s.kv("leases", f"lease.{family}.*"),
                    s.kv("leases", f"holder.{family}.*"),
                    s.kv("leases", f"member.{family}.*"),
                    s.kv(KEY_FACTS, f"fact.{family}.*"),  # its own family's key facts (compare-and-set)
                    *(
                        stream_info(s.stream(k))
                        for k in (
                            StreamKind.ACTIONS,
                            StreamKind.OUTCOMES,
                            StreamKind.DEAD_LETTERS,
                            StreamKind.RUNS,
                        )
                    ),
                    stream_info(s.kv_stream("leases")),
                    *(subject for c in consumers for subject in own_consumer(c)),
                    *direct_get(s.kv_stream("leases")),
                    stream_info(s.kv_stream(KEY_FACTS)),
                    *_facts_reads(s, family),
                    *_profile_writes(s, family),
                ],
                # The provider's by-key view of its own family only (the console's run page), answered once.
                [f"{n}.provider_view.{family}"],
                family=family,
                responses=True,
            )
        )
    reconciler = _user(
        Role.RECONCILER,
        [
            wakes,
            tickets,  # the backstop for a ticket the runtime could not publish
            *(stream_info(x) for x in all_streams),
            # Ordered consumers on the journals' milestones and on accepted runs (and their flow control).
            *(p for x in (runs, inbound) for p in (f"{API}.CONSUMER.CREATE.{x}", f"$JS.FC.{x}.>")),
            *direct_get(runs),
            # The expiry backstop: it reads pending approvals and wakes their runs, never decides one.
            stream_info(s.kv_stream(APPROVALS)),
            *direct_get(s.kv_stream(APPROVALS)),
            # Lost projections: it reads receipts and plans (never writes one), publishes lost tasks again.
            f"{n}.projection.>",
            stream_info(s.kv_stream(PROJECTIONS)),
            *direct_get(s.kv_stream(PROJECTIONS)),
            # The synthetic turn's result for the history (the turn itself goes through the gateway over HTTP).
            f"{n}.ops.synthetic.reconciler",
        ],
    )
    operator = _user(Role.OPERATOR, [f"{API}.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", f"{n}.>"], [f"{n}.>"])
    analytics = _user(
        Role.ANALYTICS,
        [
            stream_info(runs),
            # Named consumers only (durable, or ephemeral with a name), any filter within RUNS. Not the bare
            # (ephemeral) create: its body may name an existing consumer, which the server then updates, and a
            # subject permission cannot read the body (the projector's durable rewritten to filter nothing).
            f"{API}.CONSUMER.CREATE.{runs}.>",
            f"{API}.CONSUMER.DURABLE.CREATE.{runs}.*",
            f"{API}.CONSUMER.INFO.{runs}.*",
            f"{API}.CONSUMER.MSG.NEXT.{runs}.*",
            f"$JS.ACK.{runs}.>",
            f"$JS.FC.{runs}.>",
            *direct_get(runs),
            # Support tickets, read like the journals: its own consumers and direct gets, nothing else.
            stream_info(support),
            f"{API}.CONSUMER.CREATE.{support}",
            f"{API}.CONSUMER.CREATE.{support}.>",
            f"{API}.CONSUMER.INFO.{support}.*",
            f"{API}.CONSUMER.MSG.NEXT.{support}.*",
            f"$JS.ACK.{support}.>",
            f"$JS.FC.{support}.>",
            *direct_get(support),
        ],
        # Its own consumers on RUNS, never a service's (the projector's, an executor's, the runtime's).
        deny=_not_the_services(s, concrete, families, partitions),
    )
    every = [gateway, runtime, *executors, reconciler, operator, analytics, _projector(s, concrete)]
    return [u if u.role in (Role.OPERATOR, Role.ANALYTICS) else _as_service(u, s) for u in every]


def _as_service(user: NatsUser, s: Scope) -> NatsUser:
    """Each service: its own version heartbeats (issue 30); the reconciler, archiving the journals (issue 31)."""
    if user.role is Role.RECONCILER:
        user = archiver(user, s, VERSIONS)
    # Executors read who is alive and what was contracted before letting any key fact expire (issue 31).
    census = direct_get(s.kv_stream(VERSIONS)) if user.role is Role.EXECUTOR else []
    added = (s.kv(VERSIONS, f"beat.{user.name}.*"), *census)
    return replace(user, permissions=replace(user.permissions, publish=(*user.permissions.publish, *added)))


def _not_the_services(
    s: Scope, concrete: Namespace, families: Iterable[str], partitions: int
) -> tuple[str, ...]:
    """Every service durable on RUNS, which an analytics user's named consumers must never be: pulling (and
    acking) the planner's deliveries would take a run's end away from the projector, an executor's its intents
    (the journal as the bus), the runtime's its receipts; re-creating one would rewrite its filter."""
    durables = [
        projector_planner_consumer(concrete),
        receipts_consumer(concrete),
        *(executor_journal_consumer(concrete, f, p) for f in families for p in range(partitions)),
    ]
    return tuple(
        subject
        for spec in map(s.consumer, durables)
        for subject in (
            spec.next_subject,
            f"$JS.ACK.{spec.stream}.{spec.durable}.>",
            f"{API}.CONSUMER.CREATE.{spec.stream}.{spec.durable}",  # the named create without a filter token
            f"{API}.CONSUMER.CREATE.{spec.stream}.{spec.durable}.>",
            f"{API}.CONSUMER.DURABLE.CREATE.{spec.stream}.{spec.durable}",
        )
    )


def _projector(s: Scope, concrete: Namespace) -> NatsUser:
    """The projector: its durable on the run journals and direct gets of them (the outbox it plans from), the
    projection tasks it publishes and its own consumers of them (one per projection tool: any durable on the
    PROJECTIONS stream, whose create subject binds the filter to `projection.*.*`), the receipts bucket with
    each run's plan, its dead letters and operator events. No journal append, no action, no other bucket."""
    n = s.n
    runs, tasks = s.stream(StreamKind.RUNS), s.stream(StreamKind.PROJECTIONS)
    planner = s.consumer(projector_planner_consumer(concrete))
    return _user(
        Role.PROJECTOR,
        [
            f"{n}.projection.*.*",
            f"{n}.dead.projector",
            f"{n}.ops.projection_failed.*",
            s.kv(PROJECTIONS, "projection.*.*"),
            s.kv(PROJECTIONS, "plan.*"),  # each ended run's plan, beside its receipts
            *(
                stream_info(s.stream(k))
                for k in (StreamKind.RUNS, StreamKind.PROJECTIONS, StreamKind.OPS, StreamKind.DEAD_LETTERS)
            ),
            stream_info(s.kv_stream(PROJECTIONS)),
            *own_consumer(planner),
            f"{API}.CONSUMER.CREATE.{tasks}.*.{n}.projection.*.*",
            f"{API}.CONSUMER.INFO.{tasks}.*",
            f"{API}.CONSUMER.DELETE.{tasks}.*",
            f"{API}.CONSUMER.MSG.NEXT.{tasks}.*",
            f"$JS.ACK.{tasks}.>",
            *direct_get(runs),
            *direct_get(s.kv_stream(PROJECTIONS)),
        ],
    )


def _operating(s: Scope) -> list[str]:
    """What the console's operating pages need of the gateway (issue 11): read the dead letters and settle each
    once in its marks bucket (never delete a stream message), and ask a family's executors for the provider's
    by-key view (request/reply; the gateway holds no provider credential). Never publish a projection task: a
    task carries its own arguments and the projector sends what it says, so the internet-facing service could
    have any email sent; a dead projection is re-planned with operator credentials (`crashsafe dead-letters
    replay`, `crashsafe projections retry`) or by the reconciler."""
    n, dead = s.n, s.stream(StreamKind.DEAD_LETTERS)
    return [
        *direct_get(dead),
        s.kv(DEAD_MARKS, "dead.*"),
        stream_info(s.kv_stream(DEAD_MARKS)),
        *direct_get(s.kv_stream(DEAD_MARKS)),
        f"{n}.provider_view.*",
    ]


def _facts_reads(s: Scope, family: str) -> list[str]:
    """A direct get of its own family's key facts only (the last-by-subject form names the key; the JSON form,
    which could read any family's, is not granted)."""
    return [f"{API}.DIRECT.GET.{s.kv_stream(KEY_FACTS)}.{s.kv(KEY_FACTS, f'fact.{family}.*')}"]


def _profile_writes(s: Scope, family: str) -> list[str]:
    """The memory family's executor alone writes guest profiles (compare-and-set): that bucket only."""
    if family != MEMORY_FAMILY:
        return []
    return [s.kv(GUESTS, ">"), stream_info(s.kv_stream(GUESTS)), *direct_get(s.kv_stream(GUESTS))]


def user_for(all_users: Iterable[NatsUser], role: Role, family: str | None = None) -> NatsUser:
    name = user_name(role, family)
    return next(u for u in all_users if u.name == name)
