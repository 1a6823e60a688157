"""The JetStream API subjects a NATS permission grants (stream info, direct get, a consumer's own subjects) and the destructive ones it never may."""

from __future__ import annotations

from crashsafe.contracts.streams import ConsumerSpec

API = "$JS.API"
# Where a JetStream delivery is acknowledged (a delivered message's reply subject starts with it).
ACK = "$JS.ACK"


def stream_info(stream: str) -> str:
    return f"{API}.STREAM.INFO.{stream}"


# Which stream takes a subject (a body `{"subject": ...}`): how a service proves, before it is ready, that each
# subject it writes lands in the stream it expects.


def direct_get(stream: str) -> list[str]:
    """A direct get with a JSON body (by sequence, next by subject, a batch), and the last-by-subject form."""
    return [f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>"]


def consumer_create(spec: ConsumerSpec) -> str:
    """The named create, whose subject carries the filter: the server refuses a body whose filter differs, so
    this permission bounds what the consumer may read (the legacy DURABLE.CREATE subject does not)."""
    return f"{API}.CONSUMER.CREATE.{spec.stream}.{spec.durable}.{spec.filter_subject}"


def own_consumer(spec: ConsumerSpec) -> list[str]:
    """Create, inspect, recreate (delete) and settle one's own durable; pull from it if it is a pull consumer."""
    subjects = [
        consumer_create(spec),
        f"{API}.CONSUMER.INFO.{spec.stream}.{spec.durable}",
        f"{API}.CONSUMER.DELETE.{spec.stream}.{spec.durable}",
        f"{ACK}.{spec.stream}.{spec.durable}.>",
    ]
    if spec.pull:
        subjects.append(spec.next_subject)
    return subjects


# What no service role may ever ask for: only the operator changes or removes streams and their messages.
DESTRUCTIVE = (
    f"{API}.STREAM.CREATE.>",
    f"{API}.STREAM.UPDATE.>",
    f"{API}.STREAM.DELETE.>",
    f"{API}.STREAM.PURGE.>",
    f"{API}.STREAM.MSG.DELETE.>",
    f"{API}.STREAM.RESTORE.>",
    f"{API}.ACCOUNT.PURGE.>",
)
