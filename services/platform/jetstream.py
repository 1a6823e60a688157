"""The one NATS JetStream adapter: connect, subscribe, publish, declare, read a subject, ask and answer. Its
calls live in jetstream_{publish,reads,kv,declarations}.py; this is its front door (Broker and what it hands out)."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from crashsafe.contracts.errors import BrokerUnavailable, InvalidSetting, SubjectFull
from crashsafe.contracts.nats_permissions import inbox_prefix
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.streams import ConsumerSpec
from crashsafe.services.platform.jetstream_contractions import Contractions
from crashsafe.services.platform.jetstream_declarations import Declarations
from crashsafe.services.platform.jetstream_kv import KvBuckets, KvEntry
from crashsafe.services.platform.jetstream_publish import Published
from crashsafe.services.platform.jetstream_purges import Purges
from crashsafe.services.platform.jetstream_reads import StoredMessage
from crashsafe.services.platform.nats_users import CREDS_VARIABLE, read_credential
from crashsafe.services.platform.pull_feed import PullFeed, Room
from crashsafe.services.platform.run_archive import Archive
from crashsafe.services.platform.settings import NatsAccess

# What the adapter hands out, importable from its front door (SubjectFull, where it lived before its error family).
__all__ = ["Broker", "KvEntry", "Published", "StoredMessage", "SubjectFull", "Subscription"]

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
# How nats-server says a user's permissions refused something (nats-py hands it to the error callback).
_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)


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


class Broker(KvBuckets, Declarations, Contractions, Purges):
    """A connection to NATS with JetStream, and the only place library exceptions are translated."""

    def __init__(self, nc: Client, user: object = None) -> None:
        self.nc = nc
        self.user = str(user).removeprefix("_INBOX.") if user else "anonymous"
        self._publishing: dict[str, str] = {}  # reply subject -> the subject its publish went to
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self._subs: list[object] = []
        self._feeds: set[PullFeed] = set()
        self._acks: dict[str, asyncio.Future[Msg]] = {}
        self._answers: dict[str, list[Msg]] = {}
        self._deadlines: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._ack_prefix: str | None = None
        self._ack_counter = 0
        # How long creating a stream or bucket waits for a cluster to be able to place its replicas.
        self.placement_wait_s = 30.0
        # How long this process's record writers keep what they write (the TTLs they send): the deployment's.
        self.retention = RecordRetention()
        # Where the journals of archived runs are (settings.archive_dir): every journal read over this connection
        # falls back to it for a run purged from the stream (services/records/run_journal.py). None: no archive.
        self.archive: Archive | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        fail_fast: bool = False,
        *,
        access: NatsAccess | None = None,
        stop: asyncio.Event | None = None,
        retention: RecordRetention | None = None,
        archive: Archive | None = None,
    ) -> Broker:
        """Connect to NATS. A service reconnects forever (a broker restart is expected); a one-shot command
        (`fail_fast`) tries once, for a few seconds, and raises `BrokerUnavailable` instead of waiting.

        `access` says who this process is (its role's credential file) and how to check the server (TLS). A
        service passes its `stop`: a SIGTERM while NATS is away ends the wait (`BrokerUnavailable`), or the pod
        would sit out its whole termination grace period, reconnecting. `retention`: the deployment's
        (settings.retention), for every record this connection writes with a TTL; else the safe defaults.
        `archive`: the journals' archive (`open_archive(settings.archive_dir, …)`), which its journal reads fall
        back to; a connection made without it reads only the stream, as before the archive."""
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
        broker.retention = retention or broker.retention
        broker.archive = archive
        made.append(broker)
        return broker

    async def close(self) -> None:
        self._stop_waiting()
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
    ) -> Subscription:
        """Read every message on `subject` from `since` on, in order, and keep following (an ordered consumer)
        until the broker closes or the subscription is unsubscribed."""
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
        return Subscription(sub)

    # Questions and answers (core NATS request/reply) --------------------------------------------------------

    async def request(self, subject: str, payload: bytes, timeout_s: float) -> bytes:
        """One question on `subject`, answered by whichever of its subscribers replies first."""
        try:
            msg = await self.nc.request(subject, payload, timeout=timeout_s)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BrokerUnavailable(
                f"no answer on {subject} within {timeout_s:g}s ({type(exc).__name__}); is anyone serving it?",
                subject=subject,
            ) from exc
        return msg.data

    async def serve(
        self, subject: str, queue: str, answer: Callable[[bytes], Awaitable[bytes]]
    ) -> Subscription:
        """Answer the questions on `subject` with `answer`, one member of the `queue` group per question, until
        unsubscribed. A question with nowhere to reply is not answered; a reply the asker left before is dropped."""

        async def on_question(msg: Msg) -> None:
            if not msg.reply:
                return
            reply = await answer(msg.data)
            try:
                await msg.respond(reply)
            except (nats.errors.Error, OSError):
                pass  # the asker is gone, or the connection is

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_question)
        self._subs.append(sub)
        return Subscription(sub)


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
