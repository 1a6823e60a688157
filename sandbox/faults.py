"""Which injected fault the next request meets, decided purely so the shell only sleeps, refuses or drops."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, NamedTuple

import msgspec

Count = Annotated[int, msgspec.Meta(ge=0)]


class FaultTarget(StrEnum):
    """A group of endpoints faults can be aimed at; route handlers name theirs in `opt`."""

    PAYMENTS = "payments"
    BOOKINGS = "bookings"
    EMAILS = "emails"
    CRM = "crm"
    AUDIT = "audit"
    SEARCH = "search"
    MODEL = "model"
    # The by-key lookups are how callers reconcile an unknown outcome; they are only faulted
    # when aimed at explicitly, never by "*", or every chaos run would also break recovery.
    LOOKUPS = "lookups"
    ALL = "*"


class FaultSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Body of PUT /_faults. Counters count down as requests meet them; latency stays until cleared."""

    target: FaultTarget
    latency_ms: Count = 0
    # The next N requests answer 503 without committing anything.
    fail_5xx: Count = 0
    # The next N successful requests commit, then the caller never gets the response.
    drop_after_commit: Count = 0
    # The next N successful requests commit, then answer 200 with a body that is not JSON.
    malformed: Count = 0
    # Writes commit this long after they arrive (their key in use meanwhile), whether or not the caller waits.
    commit_delay_ms: Count = 0
    # On lookups: a by-key lookup says "no such key" for this long after the key's write committed.
    lookup_lag_ms: Count = 0
    # The next N requests answer 429 with `Retry-After: retry_after_s`, doing nothing.
    throttle: Count = 0
    retry_after_s: Count = 1
    # The next N requests answer 404 from "a gateway in front": an HTML body, not the provider's error shape.
    route_404: Count = 0
    # On payments: the next N charges are declined by the card (402 card_declined; the record says declined).
    decline: Count = 0
    # On payments: the next N charges are accepted as pending; they settle as captured after pending_ms.
    pending: Count = 0
    pending_ms: Count = 2000

    def is_idle(self) -> bool:
        return not (
            self.latency_ms
            or self.fail_5xx
            or self.drop_after_commit
            or self.malformed
            or self.commit_delay_ms
            or self.lookup_lag_ms
            or self.throttle
            or self.route_404
            or self.decline
            or self.pending
        )


class AfterCommit(StrEnum):
    DELIVER = "deliver"
    DROP = "drop"
    MALFORMED = "malformed"


class Refusal(StrEnum):
    """An answer given instead of handling the request: nothing is committed."""

    NONE = "none"
    FAIL_5XX = "fail_5xx"
    THROTTLE = "throttle"
    ROUTE_404 = "route_404"


class BeforeHandling(NamedTuple):
    latency_ms: int
    refusal: Refusal = Refusal.NONE
    retry_after_s: int = 0
    commit_delay_ms: int = 0


class ChargeFate(StrEnum):
    """What the card does with the next charge."""

    CAPTURED = "captured"
    DECLINED = "declined"
    PENDING = "pending"


NO_FAULT = BeforeHandling(0)


class FaultBoard:
    """The armed faults. Synchronous methods, so a countdown is consumed by exactly one request."""

    def __init__(self) -> None:
        self._specs: dict[FaultTarget, FaultSpec] = {}

    def arm(self, spec: FaultSpec) -> None:
        """Replace the faults for `spec.target`; an all-zero spec disarms it."""
        if spec.is_idle():
            self._specs.pop(spec.target, None)
        else:
            self._specs[spec.target] = msgspec.structs.replace(spec)

    def clear(self) -> None:
        self._specs.clear()

    @property
    def armed(self) -> bool:
        return bool(self._specs)

    def snapshot(self) -> dict[str, FaultSpec]:
        return {target.value: spec for target, spec in self._specs.items()}

    def before(self, target: FaultTarget | None) -> BeforeHandling:
        """Latency to add, a refusal to give instead of handling (consumes one count), a commit delay."""
        if not self._specs or target is None:
            return NO_FAULT  # the benchmark path: one dict truth test
        specs = self._applicable(target)
        latency = next((s.latency_ms for s in specs if s.latency_ms), 0)
        delay = next((s.commit_delay_ms for s in specs if s.commit_delay_ms), 0)
        for spec in specs:
            if spec.fail_5xx:
                spec.fail_5xx -= 1
                self._tidy(spec)
                return BeforeHandling(latency, Refusal.FAIL_5XX)
            if spec.throttle:
                spec.throttle -= 1
                self._tidy(spec)
                return BeforeHandling(latency, Refusal.THROTTLE, retry_after_s=spec.retry_after_s)
            if spec.route_404:
                spec.route_404 -= 1
                self._tidy(spec)
                return BeforeHandling(latency, Refusal.ROUTE_404)
        return BeforeHandling(latency, commit_delay_ms=delay)

    def lookup_lag_ms(self) -> int:
        """How long after a commit a by-key lookup still says "no such key" (armed on `lookups` only)."""
        spec = self._specs.get(FaultTarget.LOOKUPS)
        return spec.lookup_lag_ms if spec is not None else 0

    def charge_fate(self) -> tuple[ChargeFate, int]:
        """The next charge's fate, and how long a pending one stays pending; consumes one count."""
        spec = self._specs.get(FaultTarget.PAYMENTS)
        if spec is None:
            return ChargeFate.CAPTURED, 0
        if spec.decline:
            spec.decline -= 1
            self._tidy(spec)
            return ChargeFate.DECLINED, 0
        if spec.pending:
            spec.pending -= 1
            self._tidy(spec)
            return ChargeFate.PENDING, spec.pending_ms
        return ChargeFate.CAPTURED, 0

    def after_commit(self, target: FaultTarget | None) -> AfterCommit:
        """What happens to a successful response; drops are consumed before malformed bodies."""
        if not self._specs or target is None:
            return AfterCommit.DELIVER
        specs = self._applicable(target)
        for spec in specs:
            if spec.drop_after_commit:
                spec.drop_after_commit -= 1
                self._tidy(spec)
                return AfterCommit.DROP
        for spec in specs:
            if spec.malformed:
                spec.malformed -= 1
                self._tidy(spec)
                return AfterCommit.MALFORMED
        return AfterCommit.DELIVER

    def _applicable(self, target: FaultTarget) -> list[FaultSpec]:
        # The specific target's faults are met before the wildcard's.
        specs = [self._specs[target]] if target in self._specs else []
        if target is not FaultTarget.LOOKUPS and FaultTarget.ALL in self._specs:
            specs.append(self._specs[FaultTarget.ALL])
        return specs

    def _tidy(self, spec: FaultSpec) -> None:
        if spec.is_idle():
            self._specs.pop(spec.target, None)
