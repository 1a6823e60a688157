"""What of a durable consumer no release may change in place, and what it may: a live consumer compared with its spec.

Two releases share a durable during a rolling upgrade, and each declares it at start. A change to what decides
which messages a reader gets, or how (its filter, pull or push, its ack or deliver policy, how often a message
comes back), would change the other release's reader under it: such a consumer takes a new durable name and
takes over (docs/upgrading.md). Tuning (how long an ack may take, how many may be pending) is the server's to
keep: a release that declares other values uses the consumer as it is."""

from __future__ import annotations

from dataclasses import dataclass

from crashsafe.contracts.streams import ConsumerSpec

ACK_EXPLICIT = "explicit"  # every durable of ours: a message is settled only by its own ack, nak or term
DELIVER_ALL = "all"  # from the stream's first message, unless the spec says where a new durable starts


@dataclass(frozen=True, slots=True)
class ConsumerShape:
    """A durable's config as the server holds it, in plain terms (the adapter reads it off its consumer info)."""

    filter_subjects: tuple[str, ...]
    deliver_subject: str | None  # None: a pull consumer
    deliver_group: str | None
    ack_policy: str
    deliver_policy: str
    max_deliver: int
    backoff_s: tuple[float, ...] = ()
    headers_only: bool = False
    ack_wait_s: float = 30.0
    max_ack_pending: int = 1000


@dataclass(frozen=True, slots=True)
class FieldDifference:
    field: str
    declared: str
    found: str

    def __str__(self) -> str:
        return f"{self.field} declared {self.declared}, found {self.found}"


@dataclass(frozen=True, slots=True)
class ShapeComparison:
    """How a live consumer differs from its spec: in its shape (refused) and in its tuning (used as it is)."""

    shape: tuple[FieldDifference, ...] = ()
    tuning: tuple[FieldDifference, ...] = ()


def declared_shape(spec: ConsumerSpec) -> ConsumerShape:
    """The shape `spec` declares. A spec with a start lookback declares where a new durable starts, not a deliver
    policy an existing one must have (`deliver_policy` here is then only what a new one is made with)."""
    return ConsumerShape(
        filter_subjects=(spec.filter_subject,),
        deliver_subject=spec.deliver_subject,
        deliver_group=None if spec.pull else spec.durable,
        ack_policy=ACK_EXPLICIT,
        deliver_policy="by_start_time" if spec.start_lookback_s is not None else DELIVER_ALL,
        max_deliver=spec.max_deliver,
        backoff_s=spec.backoff_s,
        ack_wait_s=spec.ack_wait_s,
        max_ack_pending=spec.max_ack_pending,
    )


def compare_consumer(spec: ConsumerSpec, found: ConsumerShape) -> ShapeComparison:
    """Each field of `found` that is not what `spec` declares, as shape or tuning (the module's docstring)."""
    declared = declared_shape(spec)
    shape = [
        _differ("filter_subjects", declared.filter_subjects, found.filter_subjects),
        _differ("deliver_subject", _delivery(declared.deliver_subject), _delivery(found.deliver_subject)),
        _differ("deliver_group", declared.deliver_group, found.deliver_group),
        _differ("ack_policy", declared.ack_policy, found.ack_policy),
        # Where a durable with a lookback starts is its own (made then, moved by an operator): any start will do.
        None
        if spec.start_lookback_s is not None
        else _differ("deliver_policy", declared.deliver_policy, found.deliver_policy),
        _differ("max_deliver", declared.max_deliver, found.max_deliver),
        _differ("backoff_s", _seconds(*declared.backoff_s), _seconds(*found.backoff_s)),
        _differ("headers_only", declared.headers_only, found.headers_only),
    ]
    tuning = [
        _differ("ack_wait_s", *_seconds(declared.ack_wait_s, found.ack_wait_s)),
        _differ("max_ack_pending", declared.max_ack_pending, found.max_ack_pending),
    ]
    return ShapeComparison(
        shape=tuple(d for d in shape if d is not None), tuning=tuple(d for d in tuning if d is not None)
    )


def _seconds(*values: float) -> tuple[float, ...]:
    """Durations to the millisecond: the server keeps nanoseconds, and a float's round trip may not land exactly."""
    return tuple(round(v, 3) for v in values)


def _delivery(deliver_subject: str | None) -> str:
    return "none (pull)" if deliver_subject is None else f"{deliver_subject} (push)"


def _differ(name: str, declared: object, found: object) -> FieldDifference | None:
    if declared == found:
        return None
    return FieldDifference(name, _shown(declared), _shown(found))


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "none" if value is None else str(value)
