"""Every subject, stream, consumer and header name the services speak; nothing else spells them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

from crashsafe.contracts.keys import partition_of

DEFAULT_NAMESPACE = "crashsafe"
_TOKEN = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
# A subject token that is a literal: no wildcard, separator, space or control character.
_LITERAL = re.compile(r"^[A-Za-z0-9_\-]+$")
# The outcome-subject token of wake-ups: `_` first, so no tool family can ever take it.
WAKE_TOKEN = "_wake"


def _literal(token: str) -> str:
    if not _LITERAL.match(token):
        raise ValueError(f"{token!r} is not a literal subject token")
    return token


class EventClass(StrEnum):
    """A journal event's last subject token, so a consumer selects on the server what it would decode and drop:
    a milestone is what the projector plans on (`contracts.run_events.event_class`), every other event a step."""

    STEP = "step"
    MILESTONE = "milestone"


class StreamKind(StrEnum):
    """The streams of one namespace; the stream name is `<NAMESPACE>_<KIND>` upper-cased."""

    INBOUND = "inbound"
    RUNS = "runs"
    ACTIONS = "actions"
    OUTCOMES = "outcomes"
    DEAD_LETTERS = "dead_letters"
    # Durable timers (JetStream message scheduling): an approval's expiry fires a wake of its run.
    TIMERS = "timers"
    SUPPORT = "support"  # one ticket per handed-off run
    # Projection tasks (an email, a CRM record, the audit trail), planned from run journals, one consumer per tool.
    PROJECTIONS = "projections"
    OPS = "ops"  # events for operators (a projection that gave up)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A set of streams and subjects; tests use a unique one each so they never see each other's messages."""

    name: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not _TOKEN.match(self.name):
            raise ValueError(f"namespace {self.name!r} must match {_TOKEN.pattern}")

    def stream(self, kind: StreamKind) -> str:
        return f"{self.name}_{kind.value}".upper()

    # Inbound guest events, one subject per run so the first message for a run is also its lasting guard.
    def inbound(self, run_id: str) -> str:
        return f"{self.name}.inbound.{_literal(run_id)}"

    @property
    def inbound_all(self) -> str:
        return f"{self.name}.inbound.*"

    def run_events(self, run_id: str) -> str:
        """One run's whole journal: the filter it is read with and its version checked on."""
        return f"{self.name}.run.{_literal(run_id)}.*"

    def run_event(self, run_id: str, kind: str) -> str:
        """The run journal: each event of one run on its class's subject (`EventClass`), appended with the run's
        expected last sequence checked across all of them (`Nats-Expected-Last-Subject-Sequence-Subject`)."""
        return f"{self.name}.run.{_literal(run_id)}.{_literal(str(kind))}"

    @property
    def run_events_all(self) -> str:
        return f"{self.name}.run.*.*"

    @property
    def legacy_run_events_all(self) -> str:
        """Journals before event classes (`<ns>.run.<run_id>`): only `crashsafe infra contract`'s copy reads them."""
        return f"{self.name}.run.*"

    @property
    def run_milestones_all(self) -> str:
        return f"{self.name}.run.*.{EventClass.MILESTONE.value}"

    def journal_run(self, subject: str) -> str | None:
        """The run id of a journal subject (`run.<run_id>.<class>`); None for anything else."""
        prefix = f"{self.name}.run."
        run_id, dot, kind = subject.removeprefix(prefix).partition(".")
        known = kind in (EventClass.STEP, EventClass.MILESTONE)
        return run_id if subject.startswith(prefix) and dot and run_id and known else None

    # Action requests for one tool family, partitioned by idempotency key so one executor owns each key.
    def actions(self, family: str, partition: int) -> str:
        return f"{self.name}.action.{family}.{partition}"

    def actions_for_key(self, family: str, key: str, partitions: int) -> str:
        """The one subject every delivery of `key` goes to, so it always reaches the executor owning its store."""
        return self.actions(family, partition_of(key, partitions))

    @property
    def actions_all(self) -> str:
        return f"{self.name}.action.>"

    # Messages for the runtime about one run: each executor family's outcomes on its own subjects (so who sent
    # an outcome is part of where it arrived, and NATS permissions can say which family may publish where), and
    # wake-ups on `_wake`, which can never be a family (a family starts with a letter).
    def outcomes(self, family: str, run_id: str) -> str:
        if not _TOKEN.match(family):
            raise ValueError(f"tool family {family!r} must match {_TOKEN.pattern}")
        return f"{self.name}.outcome.{family}.{_literal(run_id)}"

    def wakes(self, run_id: str) -> str:
        return f"{self.name}.outcome.{WAKE_TOKEN}.{_literal(run_id)}"

    @property
    def outcomes_all(self) -> str:
        return f"{self.name}.outcome.>"

    def outcome_source(self, subject: str) -> tuple[str, str] | None:
        """(family or `_wake`, run id) of a subject under `outcomes_all`; None for anything else."""
        prefix = f"{self.name}.outcome."
        if not subject.startswith(prefix):
            return None
        source, dot, run_id = subject[len(prefix) :].partition(".")
        if not dot or not run_id or "." in run_id:
            return None
        return source, run_id

    def dead_letters(self, service: str) -> str:
        return f"{self.name}.dead.{service}"

    @property
    def dead_letters_all(self) -> str:
        return f"{self.name}.dead.*"

    # The provider's by-key view (request/reply, read-only): a family's executors answer what the provider says
    # about one key, so the gateway never holds a provider credential.
    def provider_view(self, family: str) -> str:
        if not _TOKEN.match(family):
            raise ValueError(f"tool family {family!r} must match {_TOKEN.pattern}")
        return f"{self.name}.provider_view.{family}"

    @property
    def provider_views_all(self) -> str:
        return f"{self.name}.provider_view.*"

    # Dead letters an operator settled (replayed or discarded): one record per dead letter's stream sequence,
    # created once (compare-and-set on revision 0), so a double click is one replay.
    @property
    def dead_letter_marks_bucket(self) -> str:
        return f"{self.name}_dead_marks"

    def dead_letter_mark_key(self, stream_seq: int) -> str:
        return f"dead.{_literal(str(stream_seq))}"

    @property
    def dead_letter_marks_all(self) -> str:
        return "dead.*"

    # Support tickets: one subject per handed-off run, so the first ticket is the lasting one.
    def support(self, tenant: str, run_id: str) -> str:
        return f"{self.name}.support.{_literal(tenant or '_')}.{_literal(run_id)}"

    @property
    def support_all(self) -> str:
        return f"{self.name}.support.>"

    # Projections: tasks planned from run journals, one subject per tool and run; each tool's worker consumes
    # `projection.<tool>.*` with its own retry policy.
    def projection(self, tool: str, run_id: str) -> str:
        return f"{self.name}.projection.{_literal(tool)}.{_literal(run_id)}"

    def projections_of(self, tool: str) -> str:
        return f"{self.name}.projection.{_literal(tool)}.*"

    @property
    def projections_all(self) -> str:
        return f"{self.name}.projection.>"

    @property
    def projector_planner_consumer(self) -> str:
        """The projector's durable on the RUNS stream: the run journal is the outbox it plans from."""
        return "projector_planner"

    def projection_consumer(self, tool: str) -> str:
        return f"projection_{_literal(tool)}"

    @property
    def projections_bucket(self) -> str:
        return f"{self.name}_projections"

    def projection_record_key(self, tool: str, key: str) -> str:
        return f"projection.{_literal(tool)}.{_digest(key)}"

    def projection_plan_key(self, run_id: str) -> str:
        """An ended run's plan (`ProjectionPlan`), in the receipts' bucket beside them."""
        return f"plan.{_digest(run_id)}"

    # Operator events: `ops.<kind>.<tool or service>` (a projection that gave up: `ops.projection_failed.<tool>`).
    def ops(self, kind: str, about: str) -> str:
        return f"{self.name}.ops.{_literal(kind)}.{_literal(about)}"

    @property
    def ops_all(self) -> str:
        return f"{self.name}.ops.>"

    # Durable consumer names.
    @property
    def runtime_inbound_consumer(self) -> str:
        return "runtime_inbound"

    @property
    def runtime_outcomes_consumer(self) -> str:
        return "runtime_outcomes"

    def executor_consumer(self, family: str, partition: int) -> str:
        return f"executor_{family}_p{partition}"

    # Partition ownership: one key-value bucket per namespace (a JetStream stream `KV_<bucket>`).
    @property
    def leases_bucket(self) -> str:
        return f"{self.name}_leases"

    def lease_key(self, family: str, partition: int) -> str:
        """Who holds a partition now: renewed with a TTL; its KV revision is the fencing token."""
        return f"lease.{_literal(family)}.{partition}"

    def leases_of(self, family: str) -> str:
        return f"lease.{_literal(family)}.*"

    def holder_key(self, family: str, partition: int) -> str:
        """Which action store last held a partition (no TTL): a new owner with another store must look up first."""
        return f"holder.{_literal(family)}.{partition}"

    def member_key(self, family: str, worker_id: str) -> str:
        """One live replica of a family, renewed with a TTL; the live members split the partitions."""
        return f"member.{_literal(family)}.{worker_token(worker_id)}"

    def members_of(self, family: str) -> str:
        return f"member.{_literal(family)}.*"

    # What a business key's first ask, attempts and undoing were, beside the partition stores (issue 17): a store
    # that never saw a key (a new volume after a takeover) learns them here instead of calling the provider.
    @property
    def key_facts_bucket(self) -> str:
        return f"{self.name}_key_facts"

    def key_facts_key(self, family: str, key: str) -> str:
        """One action key's shared facts, `fact.<family>.<digest(key)>` (keys hold `:`, which KV keys may not)."""
        return f"fact.{_literal(family)}.{_digest(key)}"

    def partition_epoch_key(self, family: str, partition: int) -> str:
        """A partition's epoch, counted up at each acquisition beside the facts it orders, `fact.<family>.epoch-<n>`
        (a key's digest is 32 hex digits: the two never meet). Not a key's facts: whatever reads `fact.<family>.*`
        as facts (an expiry sweep) must leave it out."""
        return f"fact.{_literal(family)}.epoch-{partition}"

    # API client keys: one record per key, written by the operator, read by every gateway on every request.
    @property
    def clients_bucket(self) -> str:
        return f"{self.name}_clients"

    def client_key(self, key_id: str) -> str:
        return f"client.{_literal(key_id)}"

    @property
    def clients_all(self) -> str:
        return "client.*"

    # Active runs per guest and per session (the caps): the gateway adds a run, the runtime removes it.
    @property
    def active_bucket(self) -> str:
        return f"{self.name}_active"

    def guest_active_key(self, tenant: str, guest_id: str) -> str:
        return f"guest.{_literal(tenant)}.{_digest(guest_id)}"

    def stalled_run_key(self, run_id: str) -> str:
        """The stall mark of a run whose agent's code held a runtime's event loop until its watchdog ended it: no
        process drives that run's agent again (contracts/active.py, `StallMark`)."""
        return f"stalled.{_literal(run_id)}"

    # Guest profiles (verified address, remembered preferences): the operator sets the address, the memory
    # executor writes preferences, the runtime reads a profile when a run starts.
    @property
    def guests_bucket(self) -> str:
        return f"{self.name}_guests"

    def guest_key(self, tenant: str, guest_id: str) -> str:
        return f"guest.{_literal(tenant)}.{_digest(guest_id)}"

    # Approvals of held-back actions: one record per approval, decided once by compare-and-set.
    @property
    def approvals_bucket(self) -> str:
        return f"{self.name}_approvals"

    def approval_key(self, approval_id: str) -> str:
        return f"approval.{_literal(approval_id)}"

    @property
    def approvals_all(self) -> str:
        return "approval.*"

    # Session lanes: which run owns a guest session now (fenced by the record's revision), and its history.
    @property
    def sessions_bucket(self) -> str:
        return f"{self.name}_sessions"

    def session_key(self, tenant: str, session_id: str) -> str:
        return f"session.{_literal(tenant)}.{_digest(session_id)}"

    def turn_key(self, tenant: str, run_id: str) -> str:
        """Which run a guest message (`run_id`: the run it would have started) was last handed to as its turn."""
        return f"turn.{_literal(tenant)}.{_literal(run_id)}"

    # Durable timers: a schedule (`Nats-Schedule: @at ...`) on `timer.approval.<approval_id>` fires its body (a
    # run wake) to `timer.fired.<run_id>`, which the runtime consumes. Both in the TIMERS stream: the server
    # only schedules to a subject of the schedule's own stream.
    def approval_timer(self, approval_id: str) -> str:
        return f"{self.name}.timer.approval.{_literal(approval_id)}"

    def timer_cancelled(self, approval_id: str) -> str:
        """Where the runtime asks the server to purge a decided approval's schedule (`Nats-Schedule-Next: purge`)."""
        return f"{self.name}.timer.cancelled.{_literal(approval_id)}"

    def timer_fired(self, run_id: str) -> str:
        return f"{self.name}.timer.fired.{_literal(run_id)}"

    @property
    def timers_all(self) -> str:
        return f"{self.name}.timer.>"

    @property
    def timers_fired_all(self) -> str:
        return f"{self.name}.timer.fired.*"

    def fired_run(self, subject: str) -> str | None:
        """The run id of a `timer.fired.<run_id>` subject; None for anything else."""
        prefix = f"{self.name}.timer.fired."
        run_id = subject.removeprefix(prefix)
        return run_id if subject.startswith(prefix) and run_id and "." not in run_id else None

    @property
    def runtime_timers_consumer(self) -> str:
        return "runtime_timers"

    # Version heartbeats (issue 30): each live service process keeps one key, renewed with a TTL, saying which
    # release it runs; `crashsafe upgrade check|status` and `infra contract` read them.
    @property
    def versions_bucket(self) -> str:
        return f"{self.name}_versions"

    def version_beat_key(self, service: str, worker_id: str) -> str:
        """One process's heartbeat, `beat.<service>.<worker>`: `service` is its NATS user (`executor-payment`)."""
        return f"beat.{_literal(service)}.{worker_token(worker_id)}"

    @property
    def version_beats_all(self) -> str:
        """Every live process's heartbeat: what the operator's commands scan."""
        return "beat.*.*"

    # The configuration catalog: one key, its history the published revisions; only the operator writes it.
    @property
    def catalog_bucket(self) -> str:
        return f"{self.name}_catalog"

    @property
    def catalog_key(self) -> str:
        return "catalog"


def _digest(value: str) -> str:
    """An id of any spelling as one key token (a guest id may hold `@`, `:` and `.`)."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def worker_token(worker_id: str) -> str:
    """A worker id as one subject token (a hostname's dots and anything else become `_`)."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", worker_id) or "_"


# How many partitions each tool family's action subjects are split into. Every publisher and executor of a
# deployment must agree on it; changing it moves keys between partitions, so it is a migration, not a knob.
DEFAULT_ACTION_PARTITIONS = 4
