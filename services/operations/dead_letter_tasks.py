"""Dead letters for an operator: list them, replay one once, or discard it (the console and the CLI both call this).

A dead letter stays in the DEAD stream (no service role may delete a stream message); what an operator did
with it is a `DeadLetterMark` in `<ns>_dead_marks`, created once by compare-and-set on revision 0. A replay
publishes with a `Nats-Msg-Id` derived from the letter's sequence first, then marks it: two clicks inside the
duplicate window are one message (the stream drops the second), and after the window the mark refuses it.

What a replay sends depends on who gave up on the message and what that consumer does with a second delivery
(`replay_plan`, pure): only deliveries whose consumer deduplicates by key are sent again, and an action or an
outcome is never forged by whoever replays (only the runtime signs requests, only a family's executor speaks
for it): the run is woken naming the key instead, and the runtime re-sends the journaled request with a fresh
capability, answered from the executor's receipt or the provider by key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from crashsafe.contracts.dead_letters import (
    DeadLetter,
    DeadLetterMark,
    Settled,
    dead_letter_decoder,
    dead_mark_decoder,
    dead_mark_encoder,
)
from crashsafe.contracts.errors import DeadLetterNotFound, DeadLetterSettled, LeaseConflict, ReplayRefused
from crashsafe.contracts.projections import ProjectionTask
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, decode_event
from crashsafe.contracts.streams import dead_marks_spec
from crashsafe.contracts.subjects import WAKE_TOKEN, JournalPart, Namespace, StreamKind
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, RunWake, tool_encoder
from crashsafe.domain.record_ttls import kept_ttl
from crashsafe.services.platform.jetstream import Broker

# The dead letter keeps at most this many characters of the original payload (services/platform/deliveries.py).
PAYLOAD_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class Stored:
    """A dead letter as the DEAD stream holds it, with what an operator did with it (None: nothing yet)."""

    seq: int
    letter: DeadLetter
    mark: DeadLetterMark | None
    run_id: str | None


@dataclass(frozen=True, slots=True)
class Republish:
    """Send the original payload again to `subject`; its consumer deduplicates by key."""

    subject: str
    payload: bytes
    run_id: str


@dataclass(frozen=True, slots=True)
class WakeKeys:
    """Wake the run naming `keys`: the runtime re-sends each journaled request with a fresh capability."""

    run_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class Replan:
    """A dead projection: planned again from its run's journal (what the run decided by now, as `crashsafe
    projections retry` does), then sent once; its receiver deduplicates by the task's key."""

    task: ProjectionTask


@dataclass(frozen=True, slots=True)
class Refusal:
    why: str


Plan = Republish | WakeKeys | Replan | Refusal
# Plans a dead projection again from its run's journal, now; None when the journal no longer calls for it (a
# hold released or a charge refunded since). The caller's: planning is the projector's pure code, above this layer.
Replanner = Callable[[ProjectionTask], Awaitable[ProjectionTask | None]]

_projection = msgspec.json.Decoder(ProjectionTask)
_request = msgspec.json.Decoder(ActionRequest)
_outcome = msgspec.json.Decoder(ActionOutcome)
_wake = msgspec.json.Decoder(RunWake)
_encoder = msgspec.json.Encoder()


def replay_plan(ns: Namespace, letter: DeadLetter, now: datetime) -> Plan:
    """What replaying `letter` at `now` may send, from its original subject and payload; a refusal says what
    to do instead. A payload naming another run than its subject does (what the runtime refuses as
    `wrong_subject`) is never replayed: the replay would act on a run the message was not sent for."""
    plan = _plan(ns, letter)
    named, run_id = _subject_run(ns, letter.subject), _run_of_plan(plan)
    if named is not None and run_id is not None and run_id != named:
        return Refusal(
            f"its payload names run {run_id} but it was sent on run {named}'s subject: whose it is cannot be"
            " told; discard it"
        )
    return plan


def _subject_run(ns: Namespace, subject: str) -> str | None:
    """The run a letter's original subject names, if it names one (outcomes, wakes, fired timers, projections,
    the journal's intents and receipts)."""
    source = ns.outcome_source(subject)
    if source is not None:
        return source[1]
    if (run_id := ns.journal_run(subject)) is not None:
        return run_id
    tokens = subject.split(".")
    if len(tokens) == 4 and tokens[0] == ns.name and tokens[1] == "projection":
        return tokens[3]
    return ns.fired_run(subject)


def _run_of_plan(plan: Plan) -> str | None:
    if isinstance(plan, Republish | WakeKeys):
        return plan.run_id
    if isinstance(plan, Replan):
        return plan.task.run_id
    return None


def _plan(ns: Namespace, letter: DeadLetter) -> Plan:
    tokens = letter.subject.split(".")
    if len(tokens) < 3 or tokens[0] != ns.name:
        return Refusal(f"{letter.subject} is not a subject of namespace {ns.name}")
    if len(letter.payload) >= PAYLOAD_LIMIT:
        return Refusal(
            "the dead letter kept only the first 8192 characters of the message: nothing to replay"
        )
    kind, payload = tokens[1], letter.payload.encode()
    try:
        match kind:
            case "projection":
                # Never the stored task as it was: it may say what the run no longer means (a charge refunded
                # since). Planned again from the journal, and planned after its dead receipt, so the projector
                # takes it as a new attempt (the old plan it acks and drops).
                return Replan(_projection.decode(payload))
            case "action":
                request = _request.decode(payload)
                return WakeKeys(request.run_id, [request.key])
            case "outcome" if tokens[2] == WAKE_TOKEN:
                wake = _wake.decode(payload)
                return Republish(ns.wakes(wake.run_id), payload, wake.run_id)
            case "outcome":
                outcome = _outcome.decode(payload)
                return WakeKeys(outcome.run_id, [outcome.key])
            case "run" if len(tokens) > 4 and tokens[3] in (JournalPart.INTENT, JournalPart.RECEIPT):
                # An intent or a receipt the journal carried (the bus): it stays in its journal, so nothing is
                # appended again; its run is woken naming the key, which sends the request again on ACTIONS.
                event = decode_event(payload)
                if not isinstance(event, ActionRequested | ActionCompleted):
                    return Refusal(f"{letter.subject} holds no intent or receipt: discard it")
                return WakeKeys(event.run_id, [event.key])
            case "timer" if ns.fired_run(letter.subject):
                # A fired approval expiry is a wake of its run: sent as one (only the server writes fired timers).
                wake = _wake.decode(payload)
                return Republish(ns.wakes(wake.run_id), payload, wake.run_id)
            case "inbound":
                return Refusal(
                    "a run's inbound event is kept once per run and the stream refuses a second; reconcile the"
                    " run instead (it re-reads its journal)"
                )
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Refusal(f"the payload does not decode as what {letter.subject} carries ({exc}): discard it")
    return Refusal(f"no consumer of {letter.subject} is known to take a second delivery safely")


def run_of(ns: Namespace, letter: DeadLetter) -> str | None:
    """The run a dead letter is about, if its payload names one and its subject names no other (for tenant
    scoping and the run link): a letter whose two disagree is no tenant's to see, only an admin's."""
    run_id = _run_of_plan(_plan(ns, letter))
    if run_id is None:
        try:
            value = msgspec.json.decode(letter.payload.encode())
        except msgspec.DecodeError:
            return None
        named = value.get("run_id") if isinstance(value, dict) else None
        run_id = named if isinstance(named, str) else None
    subject_run = _subject_run(ns, letter.subject)
    return run_id if subject_run is None or run_id == subject_run else None


def replay_msg_id(stream: str, seq: int) -> str:
    """The one message id every replay of this dead letter publishes under: a double click is one message."""
    return f"replay:{stream}:{seq}"


class DeadLetters:
    def __init__(self, broker: Broker, ns: Namespace, replan: Replanner | None = None) -> None:
        self.broker = broker
        self.ns = ns
        self.replan = replan
        self.stream = ns.stream(StreamKind.DEAD_LETTERS)
        self.marks = dead_marks_spec(ns)

    async def list(self, after_seq: int = 0) -> list[Stored]:
        """Every dead letter in the stream (after sequence `after_seq`), oldest first, with its mark."""
        stored = await self.broker.read_subject(self.stream, self.ns.dead_letters_all, after_seq, batch=500)
        entries = await self.broker.kv_scan(self.marks, self.ns.dead_letter_marks_all)
        marks: dict[int, DeadLetterMark] = {}
        for entry in entries:
            mark = _mark(entry.value)
            if mark is not None:
                marks[mark.stream_seq] = mark
        out = []
        for message in stored:
            try:
                letter = dead_letter_decoder.decode(message.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # not a dead letter this version reads: left in the stream, not shown
            out.append(Stored(message.seq, letter, marks.get(message.seq), run_of(self.ns, letter)))
        return out

    async def get(self, seq: int) -> Stored:
        if seq < 1:
            raise DeadLetterNotFound(stream_seq=seq)
        messages = await self.broker.read_subject(self.stream, self.ns.dead_letters_all, seq - 1, batch=1)
        message = messages[0] if messages and messages[0].seq == seq else None
        if message is None:
            raise DeadLetterNotFound(stream_seq=seq)
        try:
            letter = dead_letter_decoder.decode(message.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise DeadLetterNotFound(stream_seq=seq) from None
        entry = await self.broker.kv_get(self.marks, self.ns.dead_letter_mark_key(seq))
        mark = _mark(entry.value) if entry is not None else None
        return Stored(seq, letter, mark, run_of(self.ns, letter))

    async def replay(self, stored: Stored, by: str) -> DeadLetterMark:
        """Send the letter again once (per `replay_plan`), then mark it replayed; refused if settled or unsafe."""
        _unsettled(stored)
        plan = replay_plan(self.ns, stored.letter, datetime.now(UTC))
        msg_id = replay_msg_id(self.stream, stored.seq)
        match plan:
            case Refusal(why=why):
                raise ReplayRefused(why, stream_seq=stored.seq, subject=stored.letter.subject)
            case Republish(subject=subject, payload=payload):
                await self.broker.publish(subject, payload, msg_id=msg_id)
                sent_to = subject
            case Replan(task=dead):
                task = await self.replan(dead) if self.replan is not None else None
                if task is None:
                    why = (
                        f"run {dead.run_id}'s journal no longer calls for {dead.key} (released or refunded?):"
                        " discard it"
                        if self.replan is not None
                        else "a projection is planned again from its run's journal with operator credentials:"
                        f" `crashsafe dead-letters replay {stored.seq}` or `crashsafe projections retry {dead.key}`"
                    )
                    raise ReplayRefused(why, stream_seq=stored.seq, subject=stored.letter.subject)
                sent_to = self.ns.projection(task.tool, task.run_id)
                await self.broker.publish(sent_to, _encoder.encode(task), msg_id=msg_id)
            case WakeKeys(run_id=run_id, keys=keys):
                wake = RunWake(
                    run_id=run_id,
                    reason=f"replay of dead letter {stored.seq} by {by}",
                    at=datetime.now(UTC),
                    by=by,
                    keys=keys,
                )
                sent_to = self.ns.wakes(run_id)
                await self.broker.publish(sent_to, tool_encoder.encode(wake), msg_id=msg_id)
        return await self._mark(stored.seq, Settled.REPLAYED, by, sent_to)

    async def discard(self, stored: Stored, by: str) -> DeadLetterMark:
        _unsettled(stored)
        return await self._mark(stored.seq, Settled.DISCARDED, by)

    async def _mark(self, seq: int, settled: Settled, by: str, sent_to: str = "") -> DeadLetterMark:
        mark = DeadLetterMark(
            stream_seq=seq, settled=settled.value, by=by, at=datetime.now(UTC), replayed_to=sent_to
        )
        key = self.ns.dead_letter_mark_key(seq)
        try:
            # Kept past its letter's 30 days in DEAD_LETTERS, so no letter is ever replayed twice.
            await self.broker.kv_write(
                self.marks,
                key,
                dead_mark_encoder.encode(mark),
                revision=0,
                ttl_s=kept_ttl(self.broker.retention.dead_marks_s),
            )
        except LeaseConflict:
            # Settled meanwhile by another click (whose replay, if any, was the same message id: one message).
            entry = await self.broker.kv_get(self.marks, key)
            theirs = _mark(entry.value) if entry is not None else None
            raise DeadLetterSettled(
                stream_seq=seq,
                settled=theirs.settled if theirs else "settled",
                by=theirs.by if theirs else "another operator",
            ) from None
        return mark


def _unsettled(stored: Stored) -> None:
    if stored.mark is not None:
        raise DeadLetterSettled(stream_seq=stored.seq, settled=stored.mark.settled, by=stored.mark.by)


def _mark(value: bytes) -> DeadLetterMark | None:
    if not value:
        return None
    try:
        return dead_mark_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
