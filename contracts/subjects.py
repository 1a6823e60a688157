"""Every subject, stream, consumer and header name the services speak; nothing else spells them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from crashsafe.contracts.bucket_keys import BucketKeys
from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.tokens import digest as _digest
from crashsafe.contracts.tokens import literal as _literal

DEFAULT_NAMESPACE = "crashsafe"
_TOKEN = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
# The outcome-subject token of wake-ups: `_` first, so no tool family can ever take it.
WAKE_TOKEN = "_wake"


class EventClass(StrEnum):
    """A journal event's last subject token, so a consumer selects on the server what it would decode and drop:
    a milestone is what the projector plans on (`contracts.run_events.event_class`), every other event a step."""

    STEP = "step"
    MILESTONE = "milestone"


class JournalPart(StrEnum):
    """The bus's subjects in a run's journal (issue 33): an intent for an executor, an executor's receipt."""

    INTENT = "intent"
    RECEIPT = "receipt"


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
    # Signed checkpoints of run heads (issue 34), each chained after the last; kept forever, never deleted.
    CHECKPOINTS = "checkpoints"


@dataclass(frozen=True, slots=True)
class Namespace(BucketKeys):
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
        """One run's whole journal: the filter it is read with and its version checked on. Since 0.3.0 its intents
        and receipts may stand on subjects of their own under it (`run_intent`, `run_receipt`)."""
        return f"{self.name}.run.{_literal(run_id)}.>"

    def run_event(self, run_id: str, kind: str) -> str:
        """The run journal: each event of one run on its class's subject (`EventClass`), appended with the run's
        expected last sequence checked across all of them (`Nats-Expected-Last-Subject-Sequence-Subject`)."""
        return f"{self.name}.run.{_literal(run_id)}.{_literal(str(kind))}"

    @property
    def run_events_all(self) -> str:
        """Every run's whole journal (a reader's filter, never a stream's: the stream takes `run_subjects`)."""
        return f"{self.name}.run.*.>"

    @property
    def run_classes_all(self) -> str:
        """The journal's events of both classes (`EventClass`): every event the runtime appends but the bus's."""
        return f"{self.name}.run.*.*"

    # The journal as the bus (issue 33): an intent the runtime journals for an executor stands on a subject naming
    # its family and partition, so each partition's fenced owner pulls its own straight from the journal; the
    # executor appends its receipt on its family's subject in the run, so who wrote a receipt is part of where it
    # stands and NATS permissions say which family may write where.
    def run_intent(self, run_id: str, family: str, partition: int) -> str:
        if not _TOKEN.match(family):
            raise ValueError(f"tool family {family!r} must match {_TOKEN.pattern}")
        return f"{self.name}.run.{_literal(run_id)}.{JournalPart.INTENT}.{family}.{partition}"

    def run_intents_of(self, family: str, partition: int) -> str:
        """What one partition's owner pulls: every run's intents for its family and partition."""
        return f"{self.name}.run.*.{JournalPart.INTENT}.{_literal(family)}.{partition}"

    def run_receipt(self, run_id: str, family: str) -> str:
        """An executor's receipt, appended into its run's journal on its family's subject; a reader of a run's
        every event filters `run.<run_id>.>` (every run's: `run.*.>`), never `run.*.*` (the classes alone)."""
        if not _TOKEN.match(family):
            raise ValueError(f"tool family {family!r} must match {_TOKEN.pattern}")
        return f"{self.name}.run.{_literal(run_id)}.{JournalPart.RECEIPT}.{family}"

    @property
    def run_intents_all(self) -> str:
        return f"{self.name}.run.*.{JournalPart.INTENT}.*.*"

    @property
    def run_receipts_all(self) -> str:
        return f"{self.name}.run.*.{JournalPart.RECEIPT}.*"

    @property
    def run_subjects(self) -> tuple[str, str, str]:
        """The journal stream's subjects: the two classes and the bus's intents and receipts (none overlaps)."""
        return (self.run_classes_all, self.run_intents_all, self.run_receipts_all)

    def receipt_writer(self, subject: str) -> str | None:
        """The family a receipt's subject in this namespace names (`run.<run_id>.receipt.<family>`); None for any
        other subject."""
        return receipt_family(subject) if subject.startswith(f"{self.name}.run.") else None

    @property
    def legacy_run_events_all(self) -> str:
        """Journals before event classes (`<ns>.run.<run_id>`): only `crashsafe infra contract`'s copy reads them."""
        return f"{self.name}.run.*"

    @property
    def run_milestones_all(self) -> str:
        return f"{self.name}.run.*.{EventClass.MILESTONE.value}"

    def journal_run(self, subject: str) -> str | None:
        """The run id of a journal subject (`run.<run_id>.<class>`, `.intent.<family>.<partition>`,
        `.receipt.<family>`); None for anything else."""
        prefix = f"{self.name}.run."
        run_id, dot, kind = subject.removeprefix(prefix).partition(".")
        part, _, rest = kind.partition(".")
        known = kind in (EventClass.STEP, EventClass.MILESTONE) or (
            (part == JournalPart.INTENT and rest.count(".") == 1)
            or (part == JournalPart.RECEIPT and rest and "." not in rest)
        )
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

    @property
    def checkpoints(self) -> str:
        """The runtimes' signed checkpoints of run heads, one after the other (contracts/checkpoints.py)."""
        return f"{self.name}.checkpoint.runs"

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

    def executor_journal_consumer(self, family: str, partition: int) -> str:
        """A partition's durable on the journal: the intents journaled for it (the journal as the bus)."""
        return f"executor_{family}_p{partition}_journal"

    @property
    def runtime_receipts_consumer(self) -> str:
        """The runtime's durable on the journal's receipts: each one wakes its run."""
        return "runtime_receipts"

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


# How many partitions each tool family's action subjects are split into. Every publisher and executor of a
# deployment must agree on it; changing it moves keys between partitions, so it is a migration, not a knob.
DEFAULT_ACTION_PARTITIONS = 4


def receipt_family(subject: str) -> str | None:
    """The family a receipt's subject names (`<ns>.run.<run_id>.receipt.<family>`), in any namespace; None for
    any other subject. What a reader passes `journal_bus.read_event` when all it has is the message."""
    tokens = subject.split(".")
    if len(tokens) == 5 and tokens[1] == "run" and tokens[3] == JournalPart.RECEIPT:
        return tokens[4]
    return None
