"""Declaring what a namespace uses on JetStream (streams, buckets, durable consumers) without taking anything from
what a release beside this one uses, and checking what is there: a stream, a durable's shape, a subject's stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import nats.errors
import nats.js.errors
from nats.aio.client import Client
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

from crashsafe.contracts.consumer_shapes import ConsumerShape, FieldDifference, compare_consumer
from crashsafe.contracts.errors import (
    BrokerUnavailable,
    ConsumerShapeChanged,
    StreamMissing,
    StreamShapeChanged,
)
from crashsafe.contracts.jetstream_api import consumer_create
from crashsafe.contracts.streams import ConsumerSpec, KvSpec, Retention, StreamSpec

log = logging.getLogger("crashsafe.jetstream")

# nats-server's JSClusterNoPeersErrF ("no suitable peers for placement").
_NO_PEERS_FOR_PLACEMENT = 10005
# What NATS answers when it does not answer: no JetStream, or no reply in time.
_NO_ANSWER = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError)
# The durables whose other tuning this process already said it uses as it is: said once, not at every start.
_tuning_told: set[tuple[str, str, tuple[FieldDifference, ...]]] = set()


class Declarations:
    """The Broker's declarations: the operator's (`crashsafe infra apply`) and each service's check at start."""

    nc: Client
    js: JetStreamContext
    # How long creating a stream or bucket waits for a cluster to be able to place its replicas.
    placement_wait_s: float

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream, or bring an existing one to `spec` without taking anything from it: it keeps every
        subject it takes beside `spec`'s (a release running beside this one may write there; taking a subject
        away is a contracting step, once no older release is left), and its retention, which no release changes
        in place (StreamShapeChanged)."""
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
            deny_delete=spec.sealed,
            deny_purge=spec.sealed,
        )
        try:
            await self._placed(lambda: self.js.add_stream(config), spec.name)
        except nats.js.errors.BadRequestError as refused:
            # Exists with another config (or the create was refused for a reason of its own: then that is said).
            try:
                live = (await self.js.stream_info(spec.name)).config
            except nats.js.errors.NotFoundError:
                raise refused from None
            found = RetentionPolicy(live.retention or RetentionPolicy.LIMITS)
            if found != config.retention:
                differences = [f"retention declared {spec.retention.value}, found {found.value}"]
                raise StreamShapeChanged(stream=spec.name, differences=differences) from None
            taken = [s for s in live.subjects or [] if s not in spec.subjects]
            config.subjects = [*spec.subjects, *taken]
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
        except _NO_ANSWER as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer about consumer {durable} on {stream}: {exc}", subject=stream
            ) from exc
        return int(info.num_pending or 0)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create the durable if it does not exist; an existing one is never changed (JetStream's create action
        leaves it as it is), since a release running beside this one may read it. One of another shape raises
        ConsumerShapeChanged; one of other tuning is used as it is (said once). A durable with a start lookback
        is made starting that far back; replicas making it at once all take the one that won."""
        config = _consumer_config(spec)
        if spec.start_lookback_s is not None:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.now(UTC) - timedelta(seconds=spec.start_lookback_s)
        try:
            await self._create_consumer(spec, config)
            return
        except nats.js.errors.APIError as exc:
            # 10148 "consumer already exists": there with another config, or with another start (a replica's).
            refused = exc
        found = await self.consumer_shape(spec.stream, spec.durable)
        if found is None:
            raise refused
        compared = compare_consumer(spec, found)
        if compared.shape:
            raise ConsumerShapeChanged(
                stream=spec.stream, durable=spec.durable, differences=[str(d) for d in compared.shape]
            )
        told = (spec.stream, spec.durable, compared.tuning)
        if compared.tuning and told not in _tuning_told:
            _tuning_told.add(told)
            log.warning(
                "consumer %s on %s is used as the server has it (%s): no release changes a live consumer in"
                " place; an operator who wants this release's values edits it with the nats CLI",
                spec.durable,
                spec.stream,
                "; ".join(str(d) for d in compared.tuning),
            )

    async def _create_consumer(self, spec: ConsumerSpec, config: ConsumerConfig) -> None:
        """JetStream's named create with the `create` action: made if missing, refused (never updated) if there
        with another config. nats-py's add_consumer sends no action, which creates or updates."""
        request = {"stream_name": spec.stream, "config": config.as_dict(), "action": "create"}
        try:
            answer = await self.nc.request(consumer_create(spec), json.dumps(request).encode(), timeout=10)
        except _NO_ANSWER as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer creating consumer {spec.durable} on {spec.stream}: {exc!r}; check that"
                " nats-server runs with JetStream enabled, then start again",
                subject=spec.stream,
            ) from exc
        error = json.loads(answer.data).get("error")
        if error is not None:
            nats.js.errors.APIError.from_error(error)  # raises the error's own class (400, 404, 503, ...)

    async def consumer_shape(self, stream: str, durable: str) -> ConsumerShape | None:
        """A durable's config as the server holds it now, or None if it does not exist (one consumer_info)."""
        try:
            info = await self.js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            return None
        except _NO_ANSWER as exc:
            raise BrokerUnavailable(
                f"JetStream did not answer about consumer {durable} on {stream}: {exc}", subject=stream
            ) from exc
        c = info.config
        filters = tuple(c.filter_subjects or ()) or ((c.filter_subject,) if c.filter_subject else ())
        return ConsumerShape(
            filter_subjects=filters,
            deliver_subject=c.deliver_subject or None,
            deliver_group=c.deliver_group or None,
            ack_policy=str(AckPolicy(c.ack_policy or AckPolicy.EXPLICIT).value),
            deliver_policy=str(DeliverPolicy(c.deliver_policy or DeliverPolicy.ALL).value),
            max_deliver=-1 if c.max_deliver is None else int(c.max_deliver),
            backoff_s=tuple(c.backoff or ()),
            headers_only=bool(c.headers_only),
            ack_wait_s=float(c.ack_wait or 0.0),
            max_ack_pending=-1 if c.max_ack_pending is None else int(c.max_ack_pending),
        )

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
        # Per-key TTLs are what bound the run-scoped buckets (contracts/retention.py): a bucket made without them
        # (another client, the `nats` CLI) gets them, an additive change a release beside this one never notices.
        info = await self.js.stream_info(spec.stream)
        live = info.config
        if live.allow_rollup_hdrs or live.max_msgs_per_subject != spec.history or not live.allow_msg_ttl:
            live.allow_rollup_hdrs = False
            live.max_msgs_per_subject = spec.history  # a bucket made before its history grew
            live.allow_msg_ttl = True
            await self.js.update_stream(live)


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
