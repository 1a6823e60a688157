"""The one NATS JetStream adapter: connect, declare streams and consumers, publish, subscribe, read a subject."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
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

# SubjectFull is importable from here too, where it lived before it joined the error family.
from crashsafe.contracts.errors import (
    BrokerUnavailable,
    InvalidSetting,
    LeaseConflict,
    NotPermitted,
    RunVersionConflict,
    StreamMissing,
    SubjectFull,
)
from crashsafe.contracts.nats_permissions import inbox_prefix
from crashsafe.contracts.streams import ConsumerSpec, KvSpec, Retention, StreamSpec
from crashsafe.contracts.subjects import Header
from crashsafe.services.platform.nats_users import CREDS_VARIABLE, read_credential
from crashsafe.services.platform.pull_feed import PullFeed, Room
from crashsafe.services.platform.settings import NatsAccess

log = logging.getLogger("crashsafe.jetstream")
# What nats-py's error callback reports when the connection itself failed (a reconnect attempt, a dropped socket).
_CONNECTION_ERRORS = (
    OSError,
    TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
)

# JetStream API error codes we translate into domain errors.
_WRONG_LAST_SEQUENCE = 10071
_STREAM_NOT_FOUND = 10059
_CONSUMER_NOT_FOUND = 10014
_MAX_MSGS_PER_SUBJECT = 10077
# How nats-server says a user's permissions refused something (nats-py hands it to the error callback).
_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_pub_ack = msgspec.json.Decoder(_PubAck)


# nats-server's JSClusterNoPeersErrF ("no suitable peers for placement").
_NO_PEERS_FOR_PLACEMENT = 10005


def _read_failed(subject: str) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"JetStream did not answer a read of {subject}; try again once NATS answers", subject=subject
    )


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _only_from(
    spec: ConsumerSpec, handler: Callable[[Msg], Awaitable[None]]
) -> Callable[[Msg], Awaitable[None]]:
    """Hand over only the deliveries of `spec`'s own consumer. A push consumer's deliver subject is predictable,
    and a role allowed to create consumers elsewhere (analytics, on the runs stream) could point one at it: those
    messages are dropped unread and unacknowledged (they belong to someone else's consumer), never dead-lettered."""
    noticed = 0.0

    async def on_message(msg: Msg) -> None:
        nonlocal noticed
        try:
            meta = msg.metadata
            ours = meta.stream == spec.stream and meta.consumer == spec.durable
        except (ValueError, IndexError, nats.errors.Error):
            ours = False  # not a JetStream delivery at all
        if ours:
            await handler(msg)
            return
        now = time.monotonic()
        if now - noticed > 60.0:  # one line a minute, however long the flood
            noticed = now
            log.warning("dropped a delivery on %s that is not from consumer %s", msg.subject, spec.durable)

    return on_message


@dataclass(frozen=True, slots=True)
class StoredMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Published:
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One key's current value in a bucket, and its revision (the stream sequence that wrote it)."""

    key: str
    revision: int
    value: bytes


class Subscription:
    """A handle on one subscription, to stop it (a released partition's consumer)."""

    def __init__(self, sub: object | None = None, feed: PullFeed | None = None) -> None:
        self._sub = sub
        self._feed = feed


def _counted(room: Room, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
    async def counted(msg: Msg) -> None:
        room.overdraw()
        await handler(msg)

    return counted


def _identity(access: NatsAccess, url: str) -> dict[str, object]:
    """nats-py connect options for this process's credential (its nkey and private inbox) and TLS."""
    options: dict[str, object] = {}
    if access.creds is not None:
        credential = read_credential(access.creds)
        options["nkeys_seed_str"] = credential.seed
        options["inbox_prefix"] = inbox_prefix(credential.user)
    if access.tls or url.startswith("tls://"):
        context = ssl.create_default_context(cafile=str(access.tls_ca_file) if access.tls_ca_file else None)
        if access.tls_cert_file is not None and access.tls_key_file is not None:
            try:
                context.load_cert_chain(str(access.tls_cert_file), str(access.tls_key_file))
            except (OSError, ssl.SSLError) as exc:
                raise InvalidSetting(
                    variable="CRASHSAFE_NATS_TLS_CERT_FILE",
                    value=str(access.tls_cert_file),
                    expected=f"a PEM certificate matching CRASHSAFE_NATS_TLS_KEY_FILE ({exc})",
                ) from None
        options["tls"] = context
    return options


class Broker:
    """A connection to NATS with JetStream, and the only place library exceptions are translated."""

    def __init__(self, nc: Client, user: object = None) -> None:
        self.nc = nc
        self.user = str(user).removeprefix("_INBOX.") if user else "anonymous"
        self._publishing: dict[str, str] = {}  # reply subject -> the subject its publish went to
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self._subs: list[object] = []
        self._feeds: set[PullFeed] = set()
        self._acks: dict[str, asyncio.Future[Msg]] = {}
        self._ack_prefix: str | None = None
        self._ack_counter = 0
        # How long creating a stream or bucket waits for a cluster to be able to place its replicas.
        self.placement_wait_s = 30.0

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        fail_fast: bool = False,
        *,
        access: NatsAccess | None = None,
        stop: asyncio.Event | None = None,
    ) -> Broker:
        """Connect to NATS. A service reconnects forever (a broker restart is expected); a one-shot command
        (`fail_fast`) tries once, for a few seconds, and raises `BrokerUnavailable` instead of waiting.

        `access` says who this process is (its role's credential file) and how to check the server (TLS). A
        service passes its `stop`: a SIGTERM while NATS is away ends the wait (`BrokerUnavailable`), or the pod
        would sit out its whole termination grace period, reconnecting."""
        identity = _identity(access or NatsAccess(), url)

        made: list[Broker] = []
        # Failed connection attempts since the last good connection: an outage is one WARNING when it starts and
        # one INFO when it ends, not a line per attempt (4 a second per process while NATS is away).
        outage = {"failures": 0}

        async def on_error(exc: Exception) -> None:
            refused = _VIOLATION.search(str(exc))
            if refused and made:
                made[0]._refused(refused.group(1), refused.group(2))
                return
            # Reconnects are expected (a broker restart); say so in one line, not a traceback.
            if fail_fast:
                return
            if not isinstance(exc, _CONNECTION_ERRORS):
                # Not the connection: nats-py also reports here what a subscription's callback raised.
                log.warning("nats client: %s: %s", type(exc).__name__, exc)
                return
            outage["failures"] += 1
            level = logging.WARNING if outage["failures"] == 1 else logging.DEBUG
            log.log(level, "nats connection: %s: %s (retrying)", type(exc).__name__, exc)

        async def on_reconnected() -> None:
            if outage["failures"]:
                log.info("nats connection: back after %d failed attempts", outage["failures"])
            outage["failures"] = 0

        try:
            # nats-py's initial connect cycles its server pool until a server is discarded: one attempt per server
            # after the first (`max_reconnect_attempts=1`) is what makes it give up; the outer timeout bounds it.
            attempt = nats.connect(
                # A cluster's seed URLs, comma-separated: a service restarted while one node is down still connects.
                [server.strip() for server in url.split(",") if server.strip()],
                name=name,
                max_reconnect_attempts=1 if fail_fast else -1,
                reconnect_time_wait=0.25,
                connect_timeout=2 if fail_fast else 5,
                allow_reconnect=not fail_fast,
                error_cb=on_error,
                reconnected_cb=on_reconnected,
                **identity,
            )
            if stop is None:
                nc = await asyncio.wait_for(attempt, timeout=8 if fail_fast else None)
            else:
                nc = await _unless_stopped(attempt, stop, url)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            if isinstance(exc, nats.errors.AuthorizationError) or "Authorization Violation" in str(exc):
                raise InvalidSetting(
                    variable=CREDS_VARIABLE,
                    value=str(access.creds if access else None),
                    expected=f"credentials the NATS server at {url} admits ({exc})",
                ) from exc
            reason = str(exc) or type(exc).__name__
            raise BrokerUnavailable(
                f"cannot reach NATS at {url}: {reason}; start nats-server or set CRASHSAFE_NATS_URL", url=url
            ) from exc
        broker = cls(nc, user=identity.get("inbox_prefix"))
        made.append(broker)
        return broker

    async def close(self) -> None:
        for feed in list(self._feeds):
            await feed.stop()  # no pull request is left asking for messages nobody here will handle
        self._feeds.clear()
        try:
            await self.nc.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await self.nc.close()

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    # Declarations -------------------------------------------------------------------------------------------

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
        config = ConsumerConfig(
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
        if spec.start_lookback_s is not None:
            await self._start_of(spec, config)
        # A second try where a replica created the durable between our look and our create: its start taken.
        tries = 2 if spec.start_lookback_s is not None else 1
        for n in range(tries):
            try:
                await self.js.add_consumer(spec.stream, config)
                return
            except nats.js.errors.BadRequestError:
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

    async def subscribe(
        self, spec: ConsumerSpec, handler: Callable[[Msg], Awaitable[None]], room: Room | None = None
    ) -> Subscription:
        """Deliver the consumer's messages to `handler`; replicas sharing the durable share the work. A pull
        consumer with `room` asks only for as many messages as it has free handlers (see `PullFeed`)."""
        if spec.pull:
            feed = PullFeed(self.nc, spec, handler, room)
            await feed.start()
            self._feeds.add(feed)
            return Subscription(feed=feed)
        sub = await self.js.subscribe(
            spec.filter_subject,
            queue=spec.durable,
            stream=spec.stream,
            manual_ack=True,
            # A push consumer's messages come as the server sends them (up to max_ack_pending); `room` only
            # counts them, it cannot ask for fewer.
            cb=_only_from(spec, handler if room is None else _counted(room, handler)),
            pending_msgs_limit=max(spec.max_ack_pending * 2, 1024),
        )
        self._subs.append(sub)
        return Subscription(sub)

    async def unsubscribe(self, handle: Subscription) -> None:
        """Stop a subscription: nothing more is delivered to its handler; unacked messages come back to others."""
        if handle._feed is not None:
            self._feeds.discard(handle._feed)
            await handle._feed.stop()
            return
        sub = handle._sub
        if sub in self._subs:
            self._subs.remove(sub)
        try:
            await sub.unsubscribe()  # type: ignore[attr-defined]
        except (nats.errors.Error, OSError) as exc:
            log.warning("unsubscribe: %s: %s", type(exc).__name__, exc)

    async def follow(
        self, stream: str, subject: str, handler: Callable[[Msg], Awaitable[None]], since: datetime
    ) -> None:
        """Read every message on `subject` from `since` on, in order, and keep following (an ordered consumer)."""
        sub = await self.js.subscribe(
            subject,
            stream=stream,
            cb=handler,
            ordered_consumer=True,
            idle_heartbeat=5.0,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=since.astimezone(UTC)),
        )
        self._subs.append(sub)

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

    # Key-value ----------------------------------------------------------------------------------------------

    async def kv_get(self, spec: KvSpec, key: str) -> KvEntry | None:
        stored = await self.last_on_subject(spec.stream, spec.subject(key))
        if stored is None or stored.headers.get(Header.KV_OPERATION):
            return None
        return KvEntry(key, stored.seq, stored.data)

    async def kv_get_revision(self, spec: KvSpec, key: str, revision: int) -> KvEntry | None:
        """`key`'s value as written at `revision` (a bucket with history); None if the bucket no longer holds it."""
        try:
            raw = await self.js.get_msg(spec.stream, seq=revision, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise _read_failed(spec.subject(key)) from exc
        if raw.subject != spec.subject(key) or (raw.headers or {}).get(Header.KV_OPERATION):
            return None
        return KvEntry(key, raw.seq or revision, raw.data or b"")

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

    async def kv_delete(self, spec: KvSpec, key: str) -> None:
        """Remove `key` (a delete marker, as `nats kv del` writes; scans skip it)."""
        await self.publish(spec.subject(key), b"", headers={Header.KV_OPERATION.value: "DEL"}, timeout_s=5.0)

    # Writes -------------------------------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str | None = None,
        expected_subject_seq: int | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> Published:
        """An acknowledged JetStream publish; the PubAck comes back on this broker's own reply inbox."""
        hdrs = dict(headers or {})
        if msg_id is not None:
            hdrs[Header.MSG_ID] = msg_id
        if expected_subject_seq is not None:
            hdrs[Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_subject_seq)
        reply = await self._reply_subject()
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._acks[reply] = future
        self._publishing[reply] = subject
        expire = asyncio.get_running_loop().call_later(timeout_s, _expire, future)
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=hdrs or None)
            msg = await future
        except NotPermitted:
            raise
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BrokerUnavailable(
                f"JetStream did not acknowledge a publish to {subject}: {exc!r}; it may have landed, so publish"
                " it again with the same message id, never a new one",
                subject=subject,
            ) from exc
        finally:
            expire.cancel()
            self._acks.pop(reply, None)
            self._publishing.pop(reply, None)
        if not msg.data:
            status = (msg.headers or {}).get("Status", "")
            raise BrokerUnavailable(
                f"no stream answered a publish to {subject} (status {status}); run `crashsafe infra apply`",
                subject=subject,
            )
        ack = _pub_ack.decode(msg.data)
        if ack.error is not None:
            if ack.error.err_code == _WRONG_LAST_SEQUENCE and expected_subject_seq is not None:
                raise RunVersionConflict(subject=subject, expected_seq=expected_subject_seq)
            if ack.error.err_code == _MAX_MSGS_PER_SUBJECT:
                raise SubjectFull(subject=subject)
            raise BrokerUnavailable(
                f"JetStream refused a publish to {subject}: {ack.error.description} ({ack.error.err_code});"
                " check the stream's limits",
                subject=subject,
            )
        return Published(seq=ack.seq, duplicate=ack.duplicate)

    async def _reply_subject(self) -> str:
        # One inbox subscription for every PubAck, tokens from a counter: nats-py's request() draws random
        # bytes and arms a wait_for per call, which cost 2.6x the CPU per publish with 50 runs in flight.
        if self._ack_prefix is None:
            prefix = self.nc.new_inbox()
            await self.nc.subscribe(prefix + ".*", cb=self._on_ack)
            self._ack_prefix = prefix
        self._ack_counter += 1
        return f"{self._ack_prefix}.{self._ack_counter}"

    def _refused(self, action: str, subject: str) -> None:
        """The server refused this user a publish or subscription: fail what waits on it at once, typed."""
        log.error(
            "nats refused %s %s to %s: this role may not; see docs/security.md", self.user, action, subject
        )
        if action.lower() != "publish":
            return
        for reply, sent_to in list(self._publishing.items()):
            future = self._acks.get(reply)
            # nats-py hands the server's error over lower-cased: `$KV.<bucket>` arrives as `$kv.<bucket>`.
            if sent_to.lower() == subject.lower() and future is not None and not future.done():
                future.set_exception(NotPermitted(user=self.user, subject=subject))

    async def _on_ack(self, msg: Msg) -> None:
        future = self._acks.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg)

    # Reads --------------------------------------------------------------------------------------------------

    async def last_on_subject(self, stream: str, subject: str) -> StoredMessage | None:
        try:
            raw = await self.js.get_last_msg(stream, subject, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise _read_failed(subject) from exc
        return StoredMessage(raw.seq or 0, raw.subject or subject, raw.data or b"", dict(raw.headers or {}))

    async def first_on_subject(self, stream: str, subject: str) -> StoredMessage | None:
        """One direct get (request/reply on the shared inbox): cheaper than a batch for a single message."""
        try:
            raw = await self.js.get_msg(stream, seq=1, subject=subject, next=True, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise _read_failed(subject) from exc
        return StoredMessage(raw.seq or 0, raw.subject or subject, raw.data or b"", dict(raw.headers or {}))

    async def read_subject(
        self, stream: str, subject: str, after_seq: int = 0, batch: int = 256
    ) -> list[StoredMessage]:
        """Every message on one subject, in order, fetched with batched direct gets (one round trip per batch)."""
        out: list[StoredMessage] = []
        next_seq = after_seq + 1
        while True:
            chunk, more = await self._direct_batch(stream, subject, next_seq, batch)
            out.extend(chunk)
            if not more or not chunk:
                return out
            next_seq = chunk[-1].seq + 1

    async def _direct_batch(
        self, stream: str, subject: str, from_seq: int, batch: int
    ) -> tuple[list[StoredMessage], bool]:
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def collect(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            request = b'{"seq":%d,"next_by_subj":"%s","batch":%d}' % (from_seq, subject.encode(), batch)
            await self.nc.publish(f"$JS.API.DIRECT.GET.{stream}", request, reply=inbox)
            messages: list[StoredMessage] = []
            more = False
            while True:
                try:
                    msg = await asyncio.wait_for(queue.get(), timeout=5)
                except TimeoutError as exc:
                    raise _read_failed(subject) from exc
                headers = dict(msg.headers or {})
                status = headers.get("Status")
                if status == "404":  # nothing (more) on this subject
                    return messages, False
                if status == "204":  # end of batch
                    return messages, more
                if status:
                    raise BrokerUnavailable(
                        f"direct get on {stream} answered {status}: {headers}; check that the stream allows"
                        " direct gets (`crashsafe infra apply`)",
                        subject=subject,
                    )
                messages.append(
                    StoredMessage(
                        seq=int(headers[Header.SEQUENCE]),
                        subject=headers.get(Header.SUBJECT, subject),
                        data=msg.data,
                        headers=headers,
                    )
                )
                more = int(headers.get(Header.NUM_PENDING, "0")) > 0
        finally:
            await sub.unsubscribe()


async def _unless_stopped(attempt: Awaitable[Client], stop: asyncio.Event, url: str) -> Client:
    """The attempt's result, unless `stop` is set first: then the attempt is cancelled and the wait refused."""
    trying = asyncio.ensure_future(attempt)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({trying, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not trying.done():
        # Not awaited: nats-py's initial connect loop may take a cancel only at its next attempt; the process is
        # stopping, and asyncio.run's end cancels what is left.
        trying.cancel()
        raise BrokerUnavailable(f"stopped while waiting for NATS at {url}", url=url)
    return trying.result()
