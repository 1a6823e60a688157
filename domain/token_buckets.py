"""Request rates at the gateway: token buckets per client, per guest and per run, kept in this replica's memory.

In memory per replica: N gateway replicas behind a load balancer let through up to N times each rate (see
docs/architecture.md). Pure: the caller passes the clock."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """`per_s` tokens a second, at most `burst` saved up; `per_s` 0 means no limit."""

    per_s: float
    burst: float

    @classmethod
    def of(cls, per_s: float, burst: float | None = None) -> Rate:
        return cls(per_s, burst if burst is not None else max(2 * per_s, 1.0))


class TokenBuckets:
    """One bucket per key (a client id, a guest, a run). A bucket idle long enough to be full again is forgotten
    (a full bucket and a missing one answer the same), so what is kept is the keys of the last refill time
    (`burst / per_s`: 2 s for a guest); past `max_keys` of those, the least recently used go too. (Kept until the
    bound, a gateway held every guest it had seen: 0.4 KB a run in a steady benchmark.)"""

    def __init__(self, rate: Rate, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def take(self, key: str, now: float) -> float:
        """Take one token: 0.0 if granted, else the seconds until one will be there (for Retry-After)."""
        if self.rate.per_s <= 0:
            return 0.0
        self._forget_full(now)
        tokens, at = self._buckets.pop(key, (self.rate.burst, now))
        tokens = min(self.rate.burst, tokens + (now - at) * self.rate.per_s)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            self._trim()
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate.per_s

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget_full(self, now: float) -> None:
        # Kept in the order they were last taken from, so the longest idle come first (with a clock that never
        # goes back, as the gateway's monotonic one; a clock that does only keeps buckets longer).
        refill_s = self.rate.burst / self.rate.per_s
        buckets = self._buckets
        while buckets:
            key = next(iter(buckets))
            if now - buckets[key][1] < refill_s:
                return
            del buckets[key]

    def _trim(self) -> None:
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)  # the least recently used: the likeliest to be full again
