"""Which stream must take each subject a service writes, as a concrete sample of each kind: a service reads that
stream's subjects off the live broker before it is ready, so a release whose subjects the streams there do not
take (an older stream, a stream an operator changed) never takes work it could not record."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind

# Stands for a run, an approval or a tenant in a sample subject: any literal token lands where a real one would.
SAMPLE = "readyz"


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` one or more trailing tokens."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


@dataclass(frozen=True, slots=True)
class Route:
    subject: str  # a subject the service publishes to
    stream: str  # the stream that must take it

    def taken_by(self, subjects: Iterable[str]) -> bool:
        """A stream with these subjects takes a publish to this route's subject (streams never overlap, so it is
        the only one that does)."""
        return any(matches(pattern, self.subject) for pattern in subjects)


def runtime_routes(ns: Namespace, families: Iterable[str]) -> list[Route]:
    """A run event of each class, an action request of each family, a wake, an approval's expiry schedule and its
    cancel, a support ticket, a dead letter and a checkpoint."""
    timers = ns.stream(StreamKind.TIMERS)
    return [
        *(Route(ns.run_event(SAMPLE, kind), ns.stream(StreamKind.RUNS)) for kind in EventClass),
        *(Route(ns.actions(f, 0), ns.stream(StreamKind.ACTIONS)) for f in sorted(set(families))),
        Route(ns.wakes(SAMPLE), ns.stream(StreamKind.OUTCOMES)),
        Route(ns.approval_timer(SAMPLE), timers),
        Route(ns.timer_cancelled(SAMPLE), timers),
        Route(ns.support(SAMPLE, SAMPLE), ns.stream(StreamKind.SUPPORT)),
        Route(ns.dead_letters("runtime"), ns.stream(StreamKind.DEAD_LETTERS)),
        Route(ns.checkpoints, ns.stream(StreamKind.CHECKPOINTS)),
    ]


def executor_routes(ns: Namespace, family: str) -> list[Route]:
    """Its family's outcomes (the receipt path) and its dead letters."""
    return [
        Route(ns.outcomes(family, SAMPLE), ns.stream(StreamKind.OUTCOMES)),
        Route(ns.dead_letters(f"executor_{family}"), ns.stream(StreamKind.DEAD_LETTERS)),
    ]


def gateway_routes(ns: Namespace) -> list[Route]:
    """A guest's message (inbound) and a wake (its reconcile endpoint)."""
    return [
        Route(ns.inbound(SAMPLE), ns.stream(StreamKind.INBOUND)),
        Route(ns.wakes(SAMPLE), ns.stream(StreamKind.OUTCOMES)),
    ]


def projector_routes(ns: Namespace, tools: Iterable[str]) -> list[Route]:
    """Each projection tool's tasks and the operator event of one that gave up, and its dead letters."""
    tasks, ops = ns.stream(StreamKind.PROJECTIONS), ns.stream(StreamKind.OPS)
    return [
        *(Route(ns.projection(t, SAMPLE), tasks) for t in sorted(set(tools))),
        *(Route(ns.ops("projection_failed", t), ops) for t in sorted(set(tools))),
        Route(ns.dead_letters("projector"), ns.stream(StreamKind.DEAD_LETTERS)),
    ]


def reconciler_routes(ns: Namespace) -> list[Route]:
    """A wake, a support ticket (its backstop), a lost projection task published again, the synthetic turn's
    result."""
    return [
        Route(ns.wakes(SAMPLE), ns.stream(StreamKind.OUTCOMES)),
        Route(ns.support(SAMPLE, SAMPLE), ns.stream(StreamKind.SUPPORT)),
        Route(ns.projection(SAMPLE, SAMPLE), ns.stream(StreamKind.PROJECTIONS)),
        Route(ns.ops("synthetic", "reconciler"), ns.stream(StreamKind.OPS)),
    ]
