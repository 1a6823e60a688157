"""Key-value buckets on JetStream streams: read, scan, watch, and compare-and-set writes by revision."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from crashsafe.contracts.errors import LeaseConflict, RunVersionConflict
from crashsafe.contracts.headers import Header
from crashsafe.contracts.streams import KvSpec
from crashsafe.services.platform.jetstream_reads import DirectReads


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One key's current value in a bucket, and its revision (the stream sequence that wrote it)."""

    key: str
    revision: int
    value: bytes


class KvBuckets(DirectReads):
    """The Broker's key-value calls: a bucket is a stream, a key its subject, a revision a stream sequence."""

    _subs: list[object]

    async def kv_get(self, spec: KvSpec, key: str) -> KvEntry | None:
        stored = await self.last_on_subject(spec.stream, spec.subject(key))
        if stored is None or stored.headers.get(Header.KV_OPERATION):
            return None
        return KvEntry(key, stored.seq, stored.data)

    async def kv_get_many(self, spec: KvSpec, keys: list[str]) -> dict[str, KvEntry | None]:
        """Several keys' values, read in one batched direct get (one round trip, one snapshot of the bucket)."""
        if not keys:
            return {}
        subjects = {spec.subject(key): key for key in keys}
        found: dict[str, KvEntry | None] = dict.fromkeys(keys)
        for stored in await self.last_on_each_subject(spec.stream, list(subjects)):
            key = subjects.get(stored.subject)
            if key is not None and not stored.headers.get(Header.KV_OPERATION):
                found[key] = KvEntry(key, stored.seq, stored.data)
        return found

    async def kv_get_revision(self, spec: KvSpec, key: str, revision: int) -> KvEntry | None:
        """`key`'s value as written at `revision` (a bucket with history); None if the bucket no longer holds it."""
        stored = await self.at_sequence(spec.stream, revision, spec.subject(key))
        if stored is None or stored.subject != spec.subject(key) or stored.headers.get(Header.KV_OPERATION):
            return None
        return KvEntry(key, stored.seq or revision, stored.data)

    async def kv_history(self, spec: KvSpec, key: str) -> list[KvEntry]:
        """Every value the bucket still holds for `key`, oldest first (deletes left out)."""
        return [
            KvEntry(key, m.seq, m.data)
            for m in await self.read_subject(spec.stream, spec.subject(key))
            if not m.headers.get(Header.KV_OPERATION)
        ]

    async def kv_watch(self, spec: KvSpec, key: str, handler: Callable[[KvEntry], Awaitable[None]]) -> None:
        """Hand `handler` the key's latest value, then each new one as it is written (an ordered consumer, which
        recreates itself after a gap); deletes are skipped. Stops with the connection."""

        async def on_message(msg: Msg) -> None:
            if (msg.headers or {}).get(Header.KV_OPERATION):
                return
            await handler(KvEntry(key, msg.metadata.sequence.stream, msg.data))

        sub = await self.js.subscribe(
            spec.subject(key),
            stream=spec.stream,
            cb=on_message,
            ordered_consumer=True,
            idle_heartbeat=5.0,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        self._subs.append(sub)

    async def kv_scan(self, spec: KvSpec, pattern: str) -> list[KvEntry]:
        """Every live key matching `pattern` (`lease.payment.*`), in one batched direct get."""
        prefix = spec.subject("")
        return [
            KvEntry(m.subject.removeprefix(prefix), m.seq, m.data)
            for m in await self.read_subject(spec.stream, spec.subject(pattern))
            if not m.headers.get(Header.KV_OPERATION)
        ]

    async def kv_write(
        self, spec: KvSpec, key: str, value: bytes, *, revision: int | None, ttl_s: int | None = None
    ) -> int:
        """Write `key` if its revision is still `revision` (0: the key must not exist; None: unconditionally),
        with the server removing it `ttl_s` later unless written again. Returns the new revision."""
        headers = {Header.MSG_TTL.value: f"{ttl_s}s"} if ttl_s else None
        try:
            published = await self.publish(
                spec.subject(key), value, expected_subject_seq=revision, headers=headers, timeout_s=5.0
            )
        except RunVersionConflict:
            raise LeaseConflict(key=key, expected_revision=revision or 0) from None
        return published.seq

    async def kv_delete(self, spec: KvSpec, key: str, *, revision: int | None = None) -> None:
        """Remove `key` (a delete marker, as `nats kv del` writes; scans skip it); with `revision`, only if the key
        is still at it (LeaseConflict otherwise: someone wrote it since)."""
        try:
            await self.publish(
                spec.subject(key),
                b"",
                expected_subject_seq=revision,
                headers={Header.KV_OPERATION.value: "DEL"},
                timeout_s=5.0,
            )
        except RunVersionConflict:
            raise LeaseConflict(key=key, expected_revision=revision or 0) from None
