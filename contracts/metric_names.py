"""The metrics every service exposes on /metrics: names, kinds, labels and meaning are an operator's contract."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MetricKind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSpec:
    """One Prometheus metric. `name` is without a counter's `_total` suffix (prometheus-client adds it)."""

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    # Histogram buckets in seconds; empty for counters and gauges.
    buckets: tuple[float, ...] = ()
    # Which services set it (documentation; every service's /metrics lists every metric it registered).
    services: tuple[str, ...] = ()


# Latencies from a sub-millisecond step to a model call that takes a minute.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

RUNS_STARTED = MetricSpec(
    name="crashsafe_runs_started",
    kind=MetricKind.COUNTER,
    help="runs started (run.started journaled)",
    labels=("agent",),
    services=("runtime",),
)
RUNS_COMPLETED = MetricSpec(
    name="crashsafe_runs_completed",
    kind=MetricKind.COUNTER,
    help="runs completed (run.completed journaled)",
    labels=("agent",),
    services=("runtime",),
)
RUNS_HANDED_OFF = MetricSpec(
    name="crashsafe_runs_handed_off",
    kind=MetricKind.COUNTER,
    help="runs handed off to a person, by reason",
    labels=("agent", "reason"),
    services=("runtime",),
)
STEP_SECONDS = MetricSpec(
    name="crashsafe_step_seconds",
    kind=MetricKind.HISTOGRAM,
    help="one runtime step: a delivered event folded, decided and its outcome journaled",
    labels=("agent",),
    buckets=LATENCY_BUCKETS,
    services=("runtime",),
)
MODEL_CALL_SECONDS = MetricSpec(
    name="crashsafe_model_call_seconds",
    kind=MetricKind.HISTOGRAM,
    help="one model call, by route and outcome (ok, failover, refused, down)",
    labels=("route", "outcome"),
    buckets=LATENCY_BUCKETS,
    services=("runtime",),
)
MODEL_FAILOVERS = MetricSpec(
    name="crashsafe_model_failovers",
    kind=MetricKind.COUNTER,
    help="model routes given up on for the next one, by the route that failed",
    labels=("route",),
    services=("runtime",),
)
POLICY_DENIALS = MetricSpec(
    name="crashsafe_policy_denials",
    kind=MetricKind.COUNTER,
    help="actions refused by policy before anything was journaled as requested, by rule",
    labels=("rule",),
    services=("runtime",),
)
PROVIDER_CALLS = MetricSpec(
    name="crashsafe_provider_calls",
    kind=MetricKind.COUNTER,
    help="executor calls to a provider, by tool and outcome (succeeded, failed, unknown, conflict)",
    labels=("tool", "outcome"),
    services=("executor",),
)
PROVIDER_CALL_SECONDS = MetricSpec(
    name="crashsafe_provider_call_seconds",
    kind=MetricKind.HISTOGRAM,
    help="one provider HTTP call by an executor",
    labels=("tool",),
    buckets=LATENCY_BUCKETS,
    services=("executor",),
)
UNKNOWN_OUTCOMES_OPEN = MetricSpec(
    name="crashsafe_unknown_outcomes_open",
    kind=MetricKind.GAUGE,
    help="actions whose outcome is unknown and not yet resolved by a lookup, by tool (as of the last tick)",
    labels=("tool",),
    services=("reconciler",),
)
LOOKUPS = MetricSpec(
    name="crashsafe_lookups",
    kind=MetricKind.COUNTER,
    help="providers asked by key what became of an action, by tool and answer (found, rejected, absent, unknown)",
    labels=("tool", "answer"),
    services=("executor",),
)
DEAD_LETTERS = MetricSpec(
    name="crashsafe_dead_letters",
    kind=MetricKind.COUNTER,
    help="messages a service gave up on and dead-lettered, by service and error code",
    labels=("service", "code"),
    services=("runtime", "executor", "projector"),
)
PROJECTION_BACKLOG = MetricSpec(
    name="crashsafe_projection_backlog",
    kind=MetricKind.GAUGE,
    help="projection tasks waiting in the work queue, by tool",
    labels=("tool",),
    services=("projector",),
)
PROJECTIONS_DELIVERED = MetricSpec(
    name="crashsafe_projections",
    kind=MetricKind.COUNTER,
    help="projection attempts, by tool and result (delivered, retry, dead)",
    labels=("tool", "result"),
    services=("projector",),
)
PROJECTION_CHECKS = MetricSpec(
    name="crashsafe_projection_checks",
    kind=MetricKind.COUNTER,
    help="ended runs' projection checks by the reconciler, by how each was judged (plan: by the projector's plan and"
    " the receipts; journal: its journal read; failed: NATS away; let_go: dropped unchecked at the tracking bound)",
    labels=("result",),
    services=("reconciler",),
)
PROJECTION_CHECKS_WAITING = MetricSpec(
    name="crashsafe_projection_checks_waiting",
    kind=MetricKind.GAUGE,
    help="ended runs the reconciler tracks whose projections it has not yet seen settled (as of its last tick)",
    services=("reconciler",),
)
LEASE_OWNED = MetricSpec(
    name="crashsafe_partition_lease_owned",
    kind=MetricKind.GAUGE,
    help="1 while this replica holds the lease of a partition and may act on it (set every lease round), else 0",
    labels=("family", "partition"),
    services=("executor",),
)
CONSUMER_LAG = MetricSpec(
    name="crashsafe_consumer_lag",
    kind=MetricKind.GAUGE,
    help="messages a durable consumer has not yet been delivered (num_pending), by stream and consumer",
    labels=("stream", "consumer"),
    services=("runtime", "executor", "projector"),
)
GATEWAY_REQUESTS = MetricSpec(
    name="crashsafe_gateway_requests",
    kind=MetricKind.COUNTER,
    help="HTTP requests answered by the gateway, by route template and status code",
    labels=("route", "status"),
    services=("gateway",),
)
GATEWAY_REQUEST_SECONDS = MetricSpec(
    name="crashsafe_gateway_request_seconds",
    kind=MetricKind.HISTOGRAM,
    help="one gateway HTTP request",
    labels=("route",),
    buckets=LATENCY_BUCKETS,
    services=("gateway",),
)
SYNTHETIC_TURNS = MetricSpec(
    name="crashsafe_synthetic_turns",
    kind=MetricKind.COUNTER,
    help="synthetic turns (a scoped test tenant's non-mutating search end to end), by result",
    labels=("result",),
    services=("reconciler",),
)
SYNTHETIC_UP = MetricSpec(
    name="crashsafe_synthetic_up",
    kind=MetricKind.GAUGE,
    help="1 if the last synthetic turn answered within its budget, else 0 (apart from process health)",
    services=("reconciler",),
)
SYNTHETIC_SECONDS = MetricSpec(
    name="crashsafe_synthetic_turn_seconds",
    kind=MetricKind.HISTOGRAM,
    help="one synthetic turn, from the gateway's accept to the run's completion",
    buckets=LATENCY_BUCKETS,
    services=("reconciler",),
)
TELEMETRY_EXPORT_FAILURES = MetricSpec(
    name="crashsafe_telemetry_export_failures",
    kind=MetricKind.COUNTER,
    help="span batches the tracing backend did not take (the service goes on; this is the alert)",
    labels=("signal",),
    services=("gateway", "runtime", "executor", "projector", "reconciler"),
)
CATALOG_RELOAD_FAILURES = MetricSpec(
    name="crashsafe_catalog_reload_failures",
    kind=MetricKind.COUNTER,
    help="catalog revisions refused; new runs keep the last working catalog",
    services=("runtime",),
)
CATALOG_REVISION = MetricSpec(
    name="crashsafe_catalog_revision",
    kind=MetricKind.GAUGE,
    help="the catalog revision new runs start on",
    services=("runtime",),
)
READY = MetricSpec(
    name="crashsafe_ready",
    kind=MetricKind.GAUGE,
    help="1 while the service's readiness checks pass, else 0, by check",
    labels=("check",),
    services=("gateway", "runtime", "executor", "projector", "reconciler"),
)

KNOWLEDGE_AVAILABLE = MetricSpec(
    name="crashsafe_knowledge_available",
    kind=MetricKind.GAUGE,
    help="1 if the policy documents loaded, 0 in their degraded mode (policy questions hand off; still ready)",
    services=("runtime",),
)

ALL_METRICS: tuple[MetricSpec, ...] = (
    RUNS_STARTED,
    RUNS_COMPLETED,
    RUNS_HANDED_OFF,
    STEP_SECONDS,
    MODEL_CALL_SECONDS,
    MODEL_FAILOVERS,
    POLICY_DENIALS,
    PROVIDER_CALLS,
    PROVIDER_CALL_SECONDS,
    UNKNOWN_OUTCOMES_OPEN,
    LOOKUPS,
    DEAD_LETTERS,
    PROJECTION_BACKLOG,
    PROJECTIONS_DELIVERED,
    PROJECTION_CHECKS,
    PROJECTION_CHECKS_WAITING,
    LEASE_OWNED,
    CONSUMER_LAG,
    GATEWAY_REQUESTS,
    GATEWAY_REQUEST_SECONDS,
    SYNTHETIC_TURNS,
    SYNTHETIC_UP,
    SYNTHETIC_SECONDS,
    TELEMETRY_EXPORT_FAILURES,
    CATALOG_RELOAD_FAILURES,
    CATALOG_REVISION,
    READY,
    KNOWLEDGE_AVAILABLE,
)
