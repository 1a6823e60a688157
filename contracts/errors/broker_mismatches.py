"""What a release finds on the broker that it may not change in place while another release runs beside it (a
durable of another shape, a stream of another retention), and a service whose seams do not work yet."""

from __future__ import annotations

from crashsafe.contracts.errors.crashsafe_error import CrashsafeError, ErrorCode, RetryClass


class ConsumerShapeChanged(CrashsafeError):
    """A durable exists in another shape than this release declares (its filter, pull or push, its ack or deliver
    policy, its redeliveries): it was left as it is, since another release may be reading it."""

    code = ErrorCode.CONSUMER_SHAPE_CHANGED
    retry = RetryClass.RETRY_LATER

    stream: str
    durable: str
    differences: list[str]  # each field that differs, with what this release declares and what the server has

    def explain(self) -> str:
        return (
            f"consumer {self.durable} on {self.stream} is not the shape this release reads it in"
            f" ({'; '.join(self.differences)}); it was left as it is, since another release may read it. A new"
            " shape takes a new durable name beside the old one (docs/upgrading.md); this service stays unready"
            " until the consumer it declares is there"
        )


class StreamShapeChanged(CrashsafeError):
    """A stream exists with another retention than this release declares: nothing was changed (a work queue
    made to keep everything, or the reverse, changes what every reader of it gets)."""

    code = ErrorCode.STREAM_SHAPE_CHANGED
    retry = RetryClass.NONE

    stream: str
    differences: list[str]

    def explain(self) -> str:
        return (
            f"stream {self.stream} differs from what this release declares in what cannot change in place"
            f" ({'; '.join(self.differences)}); nothing was changed. A new retention takes a new stream beside"
            " the old one, and a later contracting step removes the old (docs/upgrading.md)"
        )


class SeamBroken(CrashsafeError):
    """A service's start found a seam it cannot work through on the live broker (a subject it writes that no
    stream, or another stream, takes; a consumer missing or of another shape): it takes no work, stays unready,
    and tries again."""

    code = ErrorCode.SEAM_BROKEN
    retry = RetryClass.RETRY_LATER

    service: str
    checks: dict[str, str]  # each failed readiness check and why

    def explain(self) -> str:
        why = "; ".join(f"{name}: {reason}" for name, reason in self.checks.items())
        return (
            f"{self.service} cannot do its job against this broker yet ({why}); it takes no work and stays"
            " unready until it can. A subject no stream takes: run `crashsafe infra apply` with this release;"
            " a consumer of another shape: see docs/upgrading.md"
        )
