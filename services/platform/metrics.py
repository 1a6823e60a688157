"""The process's Prometheus metrics, built once from contracts/metric_names.py (the one home of their names)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from crashsafe.contracts import metric_names as spec
from crashsafe.contracts.metric_names import MetricKind, MetricSpec

# One registry per process, not prometheus-client's global one: /metrics shows only crashsafe's metrics and the
# process collectors registered below, and tests can read it without other libraries' metrics.
REGISTRY = CollectorRegistry(auto_describe=True)
# process_cpu_seconds_total, process_resident_memory_bytes, open fds: read from /proc at each scrape only.
ProcessCollector(registry=REGISTRY)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _SetGauge(Gauge):
    """An unlabelled gauge with no sample until this process sets it. Every process registers every metric, and
    a gauge it never sets would read 0 there: `crashsafe_synthetic_up == 0` from each gateway, runtime, executor
    and projector pod, which never run the turn (a labelled gauge has no child until set, so needs no help)."""

    _was_set = False

    def set(self, value: float) -> None:
        self._was_set = True
        super().set(value)

    def collect(self) -> Any:
        return super().collect() if self._was_set else []


def _build(metric: MetricSpec) -> Counter | Gauge | Histogram:
    if metric.kind is MetricKind.COUNTER:
        return Counter(metric.name, metric.help, metric.labels, registry=REGISTRY)
    if metric.kind is MetricKind.GAUGE and not metric.labels:
        return _SetGauge(metric.name, metric.help, registry=REGISTRY)
    if metric.kind is MetricKind.GAUGE:
        return Gauge(metric.name, metric.help, metric.labels, registry=REGISTRY)
    return Histogram(metric.name, metric.help, metric.labels, buckets=metric.buckets, registry=REGISTRY)


def _counter(metric: MetricSpec) -> Counter:
    built = _build(metric)
    assert isinstance(built, Counter)
    return built


def _gauge(metric: MetricSpec) -> Gauge:
    built = _build(metric)
    assert isinstance(built, Gauge)
    return built


def _histogram(metric: MetricSpec) -> Histogram:
    built = _build(metric)
    assert isinstance(built, Histogram)
    return built


RUNS_STARTED = _counter(spec.RUNS_STARTED)
RUNS_COMPLETED = _counter(spec.RUNS_COMPLETED)
RUNS_HANDED_OFF = _counter(spec.RUNS_HANDED_OFF)
STEP_SECONDS = _histogram(spec.STEP_SECONDS)
MODEL_CALL_SECONDS = _histogram(spec.MODEL_CALL_SECONDS)
MODEL_FAILOVERS = _counter(spec.MODEL_FAILOVERS)
POLICY_DENIALS = _counter(spec.POLICY_DENIALS)
PROVIDER_CALLS = _counter(spec.PROVIDER_CALLS)
PROVIDER_CALL_SECONDS = _histogram(spec.PROVIDER_CALL_SECONDS)
UNKNOWN_OUTCOMES_OPEN = _gauge(spec.UNKNOWN_OUTCOMES_OPEN)
LOOKUPS = _counter(spec.LOOKUPS)
DEAD_LETTERS = _counter(spec.DEAD_LETTERS)
PROJECTION_BACKLOG = _gauge(spec.PROJECTION_BACKLOG)
PROJECTIONS_DELIVERED = _counter(spec.PROJECTIONS_DELIVERED)
PROJECTION_CHECKS = _counter(spec.PROJECTION_CHECKS)
PROJECTION_CHECKS_WAITING = _gauge(spec.PROJECTION_CHECKS_WAITING)
LEASE_OWNED = _gauge(spec.LEASE_OWNED)
CONSUMER_LAG = _gauge(spec.CONSUMER_LAG)
GATEWAY_REQUESTS = _counter(spec.GATEWAY_REQUESTS)
GATEWAY_REQUEST_SECONDS = _histogram(spec.GATEWAY_REQUEST_SECONDS)
SYNTHETIC_TURNS = _counter(spec.SYNTHETIC_TURNS)
SYNTHETIC_UP = _gauge(spec.SYNTHETIC_UP)
SYNTHETIC_SECONDS = _histogram(spec.SYNTHETIC_SECONDS)
TELEMETRY_EXPORT_FAILURES = _counter(spec.TELEMETRY_EXPORT_FAILURES)
CATALOG_RELOAD_FAILURES = _counter(spec.CATALOG_RELOAD_FAILURES)
CATALOG_REVISION = _gauge(spec.CATALOG_REVISION)
READY = _gauge(spec.READY)
KNOWLEDGE_AVAILABLE = _gauge(spec.KNOWLEDGE_AVAILABLE)


def exposition() -> bytes:
    """The text format a Prometheus scrape of /metrics reads."""
    return generate_latest(REGISTRY)


class Children:
    """A labelled metric's children, made once per label values: a hot path's increment is one dict lookup, not
    prometheus-client's locked `labels()` call (which also re-checks and re-stringifies every value)."""

    def __init__(self, metric: Counter | Gauge | Histogram) -> None:
        self.metric = metric
        self._made: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self.metric.labels(*values)
        return child
