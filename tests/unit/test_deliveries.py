"""The one delivery loop's rules, over messages that record how they were settled (no broker: its publishes are
kept in a list)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec

from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.errors import BrokerUnavailable, ErrorCode, PoisonMessage
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.deliveries import Deliveries

MAX_DELIVER = 3


@dataclass
class _Msg:
    """What the loop reads of a nats-py message, and how it was settled."""

    num_delivered: int = 1
    subject: str = "t.runs.r1"
    data: bytes = b"{}"
    settled: list[str] = field(default_factory=list)

    @property
    def metadata(self) -> Any:
        return SimpleNamespace(num_delivered=self.num_delivered, sequence=SimpleNamespace(stream=7))

    @property
    def is_acked(self) -> bool:
        return any(s != "in_progress" for s in self.settled)

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def term(self) -> None:
        self.settled.append("term")

    async def in_progress(self) -> None:
        self.settled.append("in_progress")


class _Broker:
    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    async def publish(self, subject: str, payload: bytes, **_: Any) -> None:
        self.letters.append(msgspec.json.decode(payload, type=DeadLetter))


async def _deliver(
    handler: Any, msg: _Msg, *, settles_itself: bool = False, server_stops: bool = False
) -> _Broker:
    broker = _Broker()
    loop = Deliveries(
        broker,  # type: ignore[arg-type]
        Namespace("t"),
        "test",
        logging.getLogger("tests.deliveries"),
        MAX_DELIVER,
        30.0,
        server_stops=server_stops,
    )
    await loop.dispatch(handler, settles_itself=settles_itself)(msg)  # type: ignore[arg-type]
    await loop.drain()
    await asyncio.sleep(0)
    return broker


async def _returns(msg: Any) -> None:
    return None


def _raising(exc: Exception) -> Any:
    async def handler(msg: Any) -> None:
        raise exc

    return handler


async def test_a_message_its_handler_left_unsettled_is_acked() -> None:
    msg = _Msg()
    assert not (await _deliver(_returns, msg)).letters
    assert msg.settled == ["ack"]


async def test_a_handler_that_settles_its_message_is_left_to_it() -> None:
    async def naks(msg: Any) -> None:
        await msg.nak(delay=2.0)

    msg = _Msg()
    await _deliver(naks, msg, settles_itself=True)
    assert msg.settled == ["nak"]


async def test_poison_and_undecodable_messages_are_dead_lettered_at_once() -> None:
    for exc, code in (
        (PoisonMessage("no such tool"), ErrorCode.POISON_MESSAGE),
        (msgspec.DecodeError("bad json"), ErrorCode.POISON_MESSAGE),
    ):
        msg = _Msg()
        broker = await _deliver(_raising(exc), msg)
        assert [letter.code for letter in broker.letters] == [code.value]
        assert msg.settled == ["term"]


async def test_a_retryable_error_naks_until_the_cap_unless_the_handler_counts_its_own_attempts() -> None:
    below = _Msg(num_delivered=1)
    assert not (await _deliver(_raising(BrokerUnavailable("away")), below)).letters
    assert below.settled == ["nak"]

    at_cap = _Msg(num_delivered=MAX_DELIVER)
    letters = (await _deliver(_raising(BrokerUnavailable("away")), at_cap)).letters
    assert [letter.code for letter in letters] == [ErrorCode.BROKER_UNAVAILABLE.value]
    assert at_cap.settled == ["term"]

    own = _Msg(num_delivered=MAX_DELIVER + 10)  # its own retry schedule: NATS failing is never its fault
    assert not (await _deliver(_raising(BrokerUnavailable("away")), own, settles_itself=True)).letters
    assert own.settled == ["nak"]


async def test_a_bug_is_retried_then_dead_lettered_whoever_settles() -> None:
    for settles_itself in (False, True):
        early = _Msg(num_delivered=1)
        assert not (await _deliver(_raising(KeyError("x")), early, settles_itself=settles_itself)).letters
        assert early.settled == ["nak"]

        late = _Msg(num_delivered=MAX_DELIVER)
        letters = (await _deliver(_raising(KeyError("x")), late, settles_itself=settles_itself)).letters
        assert [letter.code for letter in letters] == [ErrorCode.HANDLER_FAILED.value]
        assert late.settled == ["term"]


async def test_a_message_delivered_past_the_cap_is_given_up_before_its_handler_runs() -> None:
    ran: list[int] = []

    async def handler(msg: Any) -> None:
        ran.append(1)

    exhausted = _Msg(num_delivered=MAX_DELIVER + 1)
    letters = (await _deliver(handler, exhausted)).letters
    assert [letter.code for letter in letters] == [ErrorCode.DELIVERIES_EXHAUSTED.value]
    assert exhausted.settled == ["term"] and not ran

    own = _Msg(num_delivered=MAX_DELIVER + 1)
    assert not (await _deliver(handler, own, settles_itself=True)).letters
    assert ran == [1] and own.settled == ["ack"]


async def test_where_the_server_stops_at_the_cap_its_last_delivery_is_the_dead_letter_never_a_handler_run() -> (
    None
):
    """The executor's durables stop delivering at `max_deliver` (issue 31, item 3): there is no delivery past it,
    so the last one is given up before a handler runs, and a handler's own last run is the one before it."""
    ran: list[int] = []

    async def handler(msg: Any) -> None:
        ran.append(msg.num_delivered)

    last = _Msg(num_delivered=MAX_DELIVER)
    letters = (await _deliver(handler, last, server_stops=True)).letters
    assert [(letter.code, letter.deliveries) for letter in letters] == [
        (ErrorCode.DELIVERIES_EXHAUSTED.value, MAX_DELIVER)
    ]
    assert last.settled == ["term"] and not ran

    before = _Msg(num_delivered=MAX_DELIVER - 1)
    assert not (await _deliver(handler, before, server_stops=True)).letters
    assert ran == [MAX_DELIVER - 1] and before.settled == ["ack"]

    failing = _Msg(
        num_delivered=MAX_DELIVER - 1
    )  # a bug on the handler's last run: dead, not nakked into silence
    letters = (await _deliver(_raising(KeyError("x")), failing, server_stops=True)).letters
    assert [letter.code for letter in letters] == [ErrorCode.HANDLER_FAILED.value]
    assert failing.settled == ["term"]


async def test_a_handler_that_settled_and_then_raised_is_not_settled_twice() -> None:
    async def acks_then_fails(msg: Any) -> None:
        await msg.ack()
        raise KeyError("after the ack")

    msg = _Msg(num_delivered=1)
    await _deliver(acks_then_fails, msg, settles_itself=True)
    assert msg.settled == ["ack"]


async def test_a_message_handled_past_a_heartbeat_says_in_progress_within_one_and_a_half_of_them() -> None:
    # The ack wait's margin: a message that arrives just after a sweep must not wait two heartbeats (half the
    # ack wait) for its first "in progress", or a loop that lags a little lets it be delivered again.
    loop = Deliveries(
        _Broker(), Namespace("t"), "test", logging.getLogger("tests.deliveries"), MAX_DELIVER, 4.0
    )  # type: ignore[arg-type]
    beat = loop.heartbeat_s
    assert beat == 1.0

    def lasting(seconds: float) -> Any:
        async def handler(msg: Any) -> None:
            await asyncio.sleep(seconds)

        return handler

    first, second = _Msg(), _Msg()
    await loop.dispatch(lasting(2.2 * beat))(first)  # type: ignore[arg-type]  # starts the sweeper
    await asyncio.sleep(0.3 * beat)  # the second arrives between two sweeps
    await loop.dispatch(lasting(1.6 * beat))(second)  # type: ignore[arg-type]
    await loop.drain()
    assert "in_progress" in second.settled and second.settled[-1] == "ack"
    assert first.settled[-1] == "ack"
