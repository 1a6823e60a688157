"""Reading a stream without a consumer: direct gets of one message, of a subject's messages from a sequence on,
and of the last message on each of many subjects (the JetStream adapter's read side)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.headers import Header
from crashsafe.services.platform.jetstream_publish import Publishing

_direct_request = msgspec.json.Encoder()
# How long one direct get waits for its answers (a batch: all of them) before it says NATS did not answer.
_ANSWER_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class StoredMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


def read_failed(subject: str) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"JetStream did not answer a read of {subject}; try again once NATS answers", subject=subject
    )


@dataclass(frozen=True, slots=True)
class _Batch:
    """One batched direct get's messages, and the end-of-batch status headers (None: nothing matched, a 404)."""

    messages: list[StoredMessage]
    end: dict[str, str] | None
    more: bool  # the last message said more are pending


class DirectReads(Publishing):
    """The Broker's reads by direct get: any replica answers, and no consumer is created or left behind."""

    js: JetStreamContext

    async def last_on_subject(self, stream: str, subject: str) -> StoredMessage | None:
        return await self.direct_get(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", subject)

    async def first_on_subject(self, stream: str, subject: str) -> StoredMessage | None:
        """One direct get: cheaper than a batch for a single message."""
        request = _direct_request.encode({"seq": 1, "next_by_subj": subject})
        return await self.direct_get(f"$JS.API.DIRECT.GET.{stream}", request, subject)

    async def at_sequence(self, stream: str, seq: int, subject: str) -> StoredMessage | None:
        """The message at `seq`, whatever its subject (`subject`: what the caller reads, for the error)."""
        return await self.direct_get(f"$JS.API.DIRECT.GET.{stream}", b'{"seq":%d}' % seq, subject)

    async def direct_get(self, api_subject: str, request: bytes, subject: str) -> StoredMessage | None:
        """One message by direct get, asked on the connection's one reply inbox (`Publishing.ask`); None when the
        stream holds none that matches (404). `subject`: what was read, for the error."""
        try:
            msg = await self.ask(api_subject, request)
        except TimeoutError as exc:
            raise read_failed(subject) from exc
        headers = dict(msg.headers or {})
        if (
            Header.SEQUENCE not in headers
        ):  # not a stored message: the server's status (a message's own may differ)
            status = headers.get("Status")
            if status == "404":
                return None
            if status == "503":  # no stream answered
                raise read_failed(subject)
            described = f"{status} {headers.get('Description', '')}".strip()
            raise BrokerUnavailable(f"a read of {subject} was refused ({described})", subject=subject)
        return StoredMessage(
            int(headers.get(Header.SEQUENCE, "0")), headers.get(Header.SUBJECT, subject), msg.data, headers
        )

    async def read_subject(
        self, stream: str, subject: str, after_seq: int = 0, batch: int = 256
    ) -> list[StoredMessage]:
        """Every message on one subject after `after_seq`, in order, fetched with batched direct gets (one round
        trip per batch)."""
        out: list[StoredMessage] = []
        next_seq = after_seq + 1
        while True:
            request = {"seq": next_seq, "next_by_subj": subject, "batch": batch}
            answer = await self._direct_batch(stream, request, subject, _no_direct_gets(stream))
            out.extend(answer.messages)
            if answer.end is None or not answer.more or not answer.messages:
                return out
            next_seq = answer.messages[-1].seq + 1

    async def read_page(
        self, stream: str, subject: str, after_seq: int = 0, batch: int = 256
    ) -> list[StoredMessage]:
        """At most `batch` messages on `subject` (a wildcard too) after `after_seq`, in order: one round trip, for
        a reader that walks a stream a page at a time and stops where it likes."""
        request = {"seq": after_seq + 1, "next_by_subj": subject, "batch": batch}
        return (await self._direct_batch(stream, request, subject, _no_direct_gets(stream))).messages

    async def read_page_since(
        self, stream: str, subject: str, since: datetime, batch: int = 256
    ) -> list[StoredMessage]:
        """At most `batch` messages on `subject` stored at or after `since` (the server's receive time), in order."""
        start = since.astimezone(UTC).isoformat().replace("+00:00", "Z")
        request = {"start_time": start, "next_by_subj": subject, "batch": batch}
        return (await self._direct_batch(stream, request, subject, _no_direct_gets(stream))).messages

    async def last_on_each_subject(
        self, stream: str, subjects: str | list[str], page: int = 500
    ) -> list[StoredMessage]:
        """The last message of every subject matching `subjects` (a wildcard, or several subjects), in stream
        order: `multi_last` direct gets, paged at one stream sequence (the first page's `up_to`), so a busy stream
        still gives one consistent snapshot. Needs nats-server 2.11 or later."""
        out: list[StoredMessage] = []
        after, up_to = 0, 0
        named = subjects if isinstance(subjects, list) else [subjects]
        shown = ", ".join(named)
        while True:
            request: dict[str, object] = {"multi_last": named, "batch": page}
            if after:
                request["seq"] = after + 1
            if up_to:
                request["up_to_seq"] = up_to
            refused = (
                f"listing {stream} answered %s; this needs nats-server 2.11 or later and a stream that allows"
                " direct gets (`crashsafe infra apply`)"
            )
            answer = await self._direct_batch(stream, request, shown, refused)
            out.extend(answer.messages)
            if answer.end is None or not answer.messages:
                return out
            if not int(answer.end.get(Header.NUM_PENDING, "0")):
                return out
            up_to = int(answer.end.get(Header.UP_TO_SEQUENCE, "0"))
            after = answer.messages[-1].seq

    async def stream_head(self, stream: str) -> int:
        """The stream's last sequence now: where a reader that rendered from a read starts following."""
        try:
            info = await self.js.stream_info(stream)
        except Exception as exc:  # noqa: BLE001 -- nats-py raises several types here; all mean "not now"
            raise BrokerUnavailable(f"cannot read {stream}: {exc}; try again once NATS answers") from exc
        return int(info.state.last_seq or 0)

    async def _direct_batch(
        self, stream: str, request: dict[str, object], subject: str, refused: str
    ) -> _Batch:
        """One batched direct get: its messages until the server's end-of-batch (204) or nothing-matched (404)
        status. `refused` (with a %s for the status) is what any other status is reported as."""
        # On the connection's one reply inbox (`Publishing`), not a subscription made and dropped per read: the
        # stored messages are gathered as they come, and one wait (swept, no timer of its own) ends on the status
        # that closes the batch. A wait per message (`wait_for` on a queue) cost about 50 µs of CPU each.
        inbox, closing = await self._await_answer(subject, _ANSWER_WAIT_S, refusable=False)
        gathered: list[Msg] = []
        self._answers[inbox] = gathered
        try:
            await self.nc.publish(
                f"$JS.API.DIRECT.GET.{stream}", _direct_request.encode(request), reply=inbox
            )
            try:
                end = await closing
            except TimeoutError as exc:
                raise read_failed(subject) from exc
        finally:
            self._answers.pop(inbox, None)
            self._forget(inbox)
        messages = [
            StoredMessage(
                seq=int(headers[Header.SEQUENCE]),
                subject=headers.get(Header.SUBJECT, subject),
                data=msg.data,
                headers=headers,
            )
            for msg in gathered
            if (headers := dict(msg.headers or {}))
        ]
        more = bool(messages) and int(messages[-1].headers.get(Header.NUM_PENDING, "0")) > 0
        headers = dict(end.headers or {})
        status = headers.get("Status")
        if status == "404":  # nothing (more) on this subject
            return _Batch(messages, None, False)
        if status == "204":  # end of batch
            return _Batch(messages, headers, more)
        if status == "413":
            raise TooManySubjects(subject)
        described = f"{status} {headers.get('Description', '')}".strip()
        raise BrokerUnavailable(refused % described, subject=subject)


class TooManySubjects(Exception):
    """A `multi_last` get over more subjects than nats-server answers at once (1,024, whatever the batch: its
    `maxAllowedResponses`): the caller reads the stream instead."""


def _no_direct_gets(stream: str) -> str:
    return f"direct get on {stream} answered %s; check that the stream allows direct gets (`crashsafe infra apply`)"
