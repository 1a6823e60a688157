"""Declaring what a namespace uses on JetStream: streams, buckets and durable consumers, and checking they exist."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from crashsafe.contracts.errors import BrokerUnavailable, StreamMissing
from crashsafe.contracts.streams import ConsumerSpec, KvSpec, Retention, StreamSpec

log = logging.getLogger("crashsafe.jetstream")

# nats-server's JSClusterNoPeersErrF ("no suitable peers for placement").
_NO_PEERS_FOR_PLACEMENT = 10005
_CONSUMER_CREATE_REFUSED = 10012  # JSConsumerCreateErrF: the server could not make the change asked


class Declarations:
    """The Broker's declarations: the operator's (`crashsafe infra apply`) and each service's check at start."""

    js: JetStreamContext
    # How long creating a stream or bucket waits for a cluster to be able to place its replicas.
    placement_wait_s: float

    async def ensure_stream(self, spec: StreamSpec) -> None:
        config = StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            retention=RetentionPolicy.WORK_QUEUE
            if spec.retention == Retention.WORK_QUEUE
            else RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=spec.max_age_s or None,
            max_msgs_per_subject=spec.max_msgs_per_subject,
            discard=DiscardPolicy.NEW if spec.discard_new_per_subject else DiscardPolicy.OLD,
            # Sent only when set (nats-py leaves None out of the request), though nats-py types it a plain bool.
            discard_new_per_subject=spec.discard_new_per_subject or None,  # type: ignore[arg-type]
            duplicate_window=spec.duplicate_window_s,
            allow_direct=spec.allow_direct,
            num_replicas=spec.replicas,
            # Scheduling needs roll-ups (each schedule replaces its subject's last message); the server would
            # turn them on by itself, so say it, and the stream's config stays what we declare.
            allow_msg_schedules=spec.allow_msg_schedules or None,  # type: ignore[arg-type]
            allow_rollup_hdrs=spec.allow_msg_schedules or None,  # type: ignore[arg-type]
        )
        try:
            await self._placed(lambda: self.js.add_stream(config), spec.name)
        except nats.js.errors.BadRequestError:
            # Exists with another config: bring it in line (additive changes only; see contracts/README.md).
            await self.js.update_stream(config)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer creating stream {spec.name}: {exc}; check that nats-server runs"
                " with JetStream enabled, then start again"
            ) from exc

    async def _placed(self, create: Callable[[], Awaitable[object]], name: str) -> None:
        """Create a stream or bucket, waiting out a cluster that cannot place its replicas yet: a cluster just
        started (or one that lost a node a moment ago) answers "no suitable peers" until its peers report in, or
        does not answer in time while its metadata leader settles. Neither is "exists": taking it so would update
        a stream that is not there. Creating again is safe: the same config on an existing stream is accepted."""
        deadline = time.monotonic() + self.placement_wait_s
        while True:
            try:
                await create()
                return
            except nats.errors.TimeoutError:
                # No answer (not "no responders": that is a server without JetStream, told at once).
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.25)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != _NO_PEERS_FOR_PLACEMENT:
                    raise
                if time.monotonic() >= deadline:
                    raise BrokerUnavailable(
                        f"JetStream cannot place {name}'s replicas ({exc.description}) after"
                        f" {self.placement_wait_s:.0f}s: check that enough cluster nodes are up for the replica"
                        " count (CRASHSAFE_STREAM_REPLICAS), then apply again"
                    ) from exc
                await asyncio.sleep(0.25)

    async def require_stream(self, name: str) -> None:
        """A service's check that a stream (or a bucket's `KV_` stream) it uses was provisioned; services never
        create streams (only the operator may: `crashsafe infra apply`)."""
        try:
            await self.js.stream_info(name)
        except nats.js.errors.NotFoundError:
            raise StreamMissing(stream=name) from None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer about stream {name}: {exc}; check that nats-server runs with"
                " JetStream enabled and that this role may read it",
            ) from exc

    async def stream_exists(self, name: str) -> bool:
        try:
            await self.js.stream_info(name)
            return True
        except nats.js.errors.NotFoundError:
            return False

    async def stream_subjects(self, name: str) -> list[str] | None:
        """The subjects a stream takes, as the server holds them (None: no such stream)."""
        try:
            info = await self.js.stream_info(name)
        except nats.js.errors.NotFoundError:
            return None
        return list(info.config.subjects or [])

    async def purge_subject(self, stream: str, subject: str) -> None:
        """Remove every message on `subject` (a filter) from `stream`: the operator's, for a finished migration."""
        await self.js.purge_stream(stream, subject=subject)

    async def consumer_pullers(self, stream: str, durable: str) -> int:
        """Pull requests waiting on a durable right now (0 if it does not exist): a live process pulls from it."""
        try:
            info = await self.js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            return 0
        return int(info.num_waiting or 0)

    async def start_consumer_at(self, spec: ConsumerSpec, seq: int) -> None:
        """Make the durable anew, delivering from stream sequence `seq`: what lies before is not its work."""
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_consumer(spec.stream, spec.durable)
        config = _consumer_config(spec)
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = seq
        await self.js.add_consumer(spec.stream, config)

    async def consumer_pending(self, stream: str, durable: str) -> int | None:
        """A durable's messages not yet delivered (num_pending), or None if it does not exist: one consumer_info,
        for readiness and the lag gauges (never per message)."""
        try:
            info = await self.js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            return None
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionClosedError,
        ) as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer about consumer {durable} on {stream}: {exc}", subject=stream
            ) from exc
        return int(info.num_pending or 0)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create the durable, or bring it to `spec`. A change the server cannot make in place (push to pull)
        recreates it from just after its ack floor: nothing acknowledged comes back, nothing unacknowledged is lost."""
        config = _consumer_config(spec)
        if spec.start_lookback_s is not None:
            await self._start_of(spec, config)
        # A second try where a replica created the durable between our look and our create: its start taken.
        # (Replicas started together race here: the server refuses the second start time with a 400 or, as
        # nats-server 2.11 does, a 500 with err_code 10012 "start time can not be updated".)
        tries = 2 if spec.start_lookback_s is not None else 1
        for n in range(tries):
            try:
                await self.js.add_consumer(spec.stream, config)
                return
            except nats.js.errors.APIError as exc:
                if not (exc.code == 400 or exc.err_code == _CONSUMER_CREATE_REFUSED):
                    raise
                if n + 1 == tries or not await self._start_of(spec, config):
                    break
        info = await self.js.consumer_info(spec.stream, spec.durable)
        config.opt_start_time = None
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = info.ack_floor.stream_seq + 1 if info.ack_floor else 1
        log.warning(
            "consumer %s cannot change in place; recreated from stream sequence %d",
            spec.durable,
            config.opt_start_seq,
        )
        await self.js.delete_consumer(spec.stream, spec.durable)
        await self.js.add_consumer(spec.stream, config)

    async def _start_of(self, spec: ConsumerSpec, config: ConsumerConfig) -> bool:
        """Where the durable starts: an existing one's own start (so an update is made in place: it keeps its
        place), a new one `spec.start_lookback_s` back. True if it exists."""
        assert spec.start_lookback_s is not None
        try:
            existing = (await self.js.consumer_info(spec.stream, spec.durable)).config
        except nats.js.errors.NotFoundError:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.now(UTC) - timedelta(seconds=spec.start_lookback_s)
            return False
        config.deliver_policy = existing.deliver_policy
        config.opt_start_time = existing.opt_start_time
        config.opt_start_seq = existing.opt_start_seq
        return True

    async def ensure_kv(self, spec: KvSpec) -> None:
        """A key-value bucket with per-key TTLs allowed (nats-py declares its stream with allow_msg_ttl)."""
        config = KeyValueConfig(
            bucket=spec.bucket,
            history=spec.history,
            storage=StorageType.FILE,
            replicas=spec.replicas,
            direct=True,
        )
        try:
            await self._placed(lambda: self.js.create_key_value(config), f"bucket {spec.bucket}")
        except nats.js.errors.BadRequestError:
            pass  # exists (a replica or `infra apply` made it); its config is ours
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer creating bucket {spec.bucket}: {exc}; check that nats-server runs"
                " with JetStream enabled, then start again"
            ) from exc
        # nats-py turns rollup headers on for every bucket. A `Nats-Rollup: all` on one key a user may write wipes
        # every key of the bucket (another family's leases and holders, another tenant's active runs): no NATS
        # permission can see a header, so the bucket refuses it. Nothing here ever rolls up (a delete is a marker).
        info = await self.js.stream_info(spec.stream)
        if info.config.allow_rollup_hdrs or info.config.max_msgs_per_subject != spec.history:
            info.config.allow_rollup_hdrs = False
            info.config.max_msgs_per_subject = spec.history  # a bucket made before its history grew
            await self.js.update_stream(info.config)


def _consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        # Named: the create subject then carries the filter, which is what a role's permission checks.
        name=spec.durable,
        durable_name=spec.durable,
        deliver_subject=spec.deliver_subject,
        deliver_group=None if spec.pull else spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=spec.filter_subject,
        backoff=list(spec.backoff_s) or None,
    )
