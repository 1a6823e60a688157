"""Acknowledged JetStream publishes, each PubAck read on one shared reply inbox, and a refused one typed."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

# SubjectFull is importable from here too, where it lived before it joined the error family.
from crashsafe.contracts.errors import BrokerUnavailable, NotPermitted, RunVersionConflict, SubjectFull
from crashsafe.contracts.headers import Header
from crashsafe.contracts.release import VERSION

log = logging.getLogger("crashsafe.jetstream")

# JetStream API error codes we translate into domain errors.
_WRONG_LAST_SEQUENCE = 10071
_MAX_MSGS_PER_SUBJECT = 10077


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


@dataclass(frozen=True, slots=True)
class Published:
    seq: int
    duplicate: bool


# Stamped on every publish (a KV write's too): which release wrote a message, when two run side by side. Built
# once; this process's stamp wins over one a copied message brought along.
_STAMP = {Header.VERSION.value: VERSION}

# How often waits for a PubAck or an answer are checked against their time: they fail at most this late.
_SWEEP_S = 0.1


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class Publishing:
    """The Broker's writes: one publish path, whose acks come back on this connection's own inbox."""

    nc: Client
    user: str
    _publishing: dict[str, str]  # reply subject -> the subject its publish went to
    _acks: dict[str, asyncio.Future[Msg]]
    # reply subject -> a batched read's stored messages so far (its future resolves on the server's closing status)
    _answers: dict[str, list[Msg]]
    _ack_prefix: str | None
    _ack_counter: int
    _deadlines: dict[str, float]  # reply subject -> when its wait ends (loop time), swept by `_expire_late`
    _sweeper: asyncio.Task[None] | None

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str | None = None,
        expected_subject_seq: int | None = None,
        sequence_subject: str | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> Published:
        """An acknowledged JetStream publish; the PubAck comes back on this broker's own reply inbox.

        With `expected_subject_seq`, only if the last message on `subject` (or on the filter `sequence_subject`,
        which may span several subjects) is at that sequence; RunVersionConflict otherwise."""
        hdrs = {**headers, **_STAMP} if headers else _STAMP.copy()
        if msg_id is not None:
            hdrs[Header.MSG_ID] = msg_id
        if expected_subject_seq is not None:
            hdrs[Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_subject_seq)
            if sequence_subject is not None:
                hdrs[Header.EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT] = sequence_subject
        reply, future = await self._await_answer(subject, timeout_s)
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=hdrs)
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
            self._forget(reply)
        if not msg.data:
            status = (msg.headers or {}).get("Status", "")
            raise BrokerUnavailable(
                f"no stream answered a publish to {subject} (status {status}); run `crashsafe infra apply`",
                subject=subject,
            )
        ack = _pub_ack.decode(msg.data)
        if ack.error is not None:
            if ack.error.err_code == _WRONG_LAST_SEQUENCE and expected_subject_seq is not None:
                raise RunVersionConflict(
                    subject=sequence_subject or subject, expected_seq=expected_subject_seq
                )
            if ack.error.err_code == _MAX_MSGS_PER_SUBJECT:
                raise SubjectFull(subject=subject)
            raise BrokerUnavailable(
                f"JetStream refused a publish to {subject}: {ack.error.description} ({ack.error.err_code});"
                " check the stream's limits",
                subject=subject,
            )
        return Published(seq=ack.seq, duplicate=ack.duplicate)

    async def ask(self, subject: str, payload: bytes, timeout_s: float = 10.0) -> Msg:
        """A request answered on the same one reply inbox as every PubAck (a direct get): its answer, whatever
        its status; TimeoutError when none comes, a refused subject included (a read refused by a permission
        being rolled out is retried as unavailable, never dead-lettered as a bad message). nats-py's request()
        cost 3x the client CPU per answer (bench/message_floor.py: 64 against 22 µs)."""
        reply, future = await self._await_answer(subject, timeout_s, refusable=False)
        try:
            await self.nc.publish(subject, payload, reply=reply)
            return await future
        finally:
            self._forget(reply)

    async def _await_answer(
        self, subject: str, timeout_s: float, refusable: bool = True
    ) -> tuple[str, asyncio.Future[Msg]]:
        """A reply subject on the one inbox and the future its answer resolves, failed with TimeoutError once
        `timeout_s` has passed (by the sweeper: a timer per publish cost 6 µs to arm and cancel)."""
        reply = await self._reply_subject()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._acks[reply] = future
        if refusable:  # a publish the server refuses this user fails at once, as NotPermitted
            self._publishing[reply] = subject
        self._deadlines[reply] = loop.time() + timeout_s
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._expire_late())
        return reply, future

    def _stop_waiting(self) -> None:
        """The connection is closing: nothing will answer now, and no sweeper will time a wait out."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for future in list(self._acks.values()):
            _expire(future)

    def _forget(self, reply: str) -> None:
        self._acks.pop(reply, None)
        self._publishing.pop(reply, None)
        self._deadlines.pop(reply, None)

    async def _expire_late(self) -> None:
        """Fail every wait whose time has passed, a few times a second: at most `_SWEEP_S` late. Ends once nothing
        waits (the next wait starts it again), so an idle connection keeps no task awake."""
        loop = asyncio.get_running_loop()
        while self._deadlines:
            await asyncio.sleep(_SWEEP_S)
            now = loop.time()
            for reply, deadline in list(self._deadlines.items()):
                future = self._acks.get(reply)
                if deadline <= now and future is not None:
                    _expire(future)
        self._sweeper = None

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
        gathered = self._answers.get(msg.subject)
        if gathered is not None and Header.SEQUENCE in (msg.headers or {}):
            gathered.append(msg)  # one stored message of a batched read; a status (no sequence) ends it
            return
        future = self._acks.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg)
