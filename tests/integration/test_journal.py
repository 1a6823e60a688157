"""The run journal on the real nats-server: an append carries the version it was decided at, and only one
append per version can win."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import msgspec
import pytest

from crashsafe.contracts.errors import ErrorCode, RetryClass, RunVersionConflict
from crashsafe.contracts.run_events import ModelAnswered, RunCompleted, RunStarted
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.domain.fold import replay
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage
from crashsafe.services.records.run_journal import RunJournal
from tests.support.broker import ensure_streams
from tests.support.runs import started


def _started(run_id: str, now: datetime) -> RunStarted:
    return msgspec.structs.replace(started(at=now), run_id=run_id)


async def test_appends_at_the_same_version_one_wins(broker: Broker, namespace: Namespace) -> None:
    await ensure_streams(broker, namespace)
    journal = RunJournal(broker, namespace)
    run_id = "run_" + uuid.uuid4().hex[:24]
    now = datetime.now(UTC)
    started = _started(run_id, now)
    seq = await journal.append(started, 0)
    with pytest.raises(RunVersionConflict):
        await journal.append(started, 0)  # a second start for the same run

    for step in range(1, 6):
        contenders = [
            ModelAnswered(
                run_id=run_id,
                at=now,
                step_no=step,
                model="m",
                response_id=f"resp_{step}_{writer}",
                reply=f"writer {writer}",
            )
            for writer in range(3)
        ]
        results = await asyncio.gather(*(journal.append(c, seq) for c in contenders), return_exceptions=True)
        wins = [(c, r) for c, r in zip(contenders, results, strict=True) if isinstance(r, int)]
        losses = [r for r in results if isinstance(r, RunVersionConflict)]
        assert len(wins) == 1 and len(losses) == 2, results
        for loss in losses:
            assert (loss.code, loss.retry) == (ErrorCode.RUN_VERSION_CONFLICT, RetryClass.RETRY_LATER)
            assert loss.expected_seq == seq and loss.details()["expected_seq"] == seq
        winner, seq = wins[0]
        events, last = await journal.read(run_id)
        assert last == seq and events[-1] == winner and len(events) == step + 1

    state = replay(events)
    assert state is not None and state.model_steps == 5 and state.next_step == 6


async def test_a_step_and_a_milestone_at_the_same_version_one_wins(
    broker: Broker, namespace: Namespace
) -> None:
    """A run's journal spans a subject per event class; its version is checked across all of them, so a step and
    the run's end decided at the same version cannot both land (each on its own subject would)."""
    await ensure_streams(broker, namespace)
    journal = RunJournal(broker, namespace)
    run_id = "run_" + uuid.uuid4().hex[:24]
    now = datetime.now(UTC)
    seq = await journal.append(_started(run_id, now), 0)
    for round_no in range(5):
        step = ModelAnswered(
            run_id=run_id, at=now, step_no=1, model="m", response_id=f"r{round_no}", reply="x"
        )
        end = RunCompleted(run_id=run_id, at=now, reply="done")
        results = await asyncio.gather(
            journal.append(step, seq), journal.append(end, seq), return_exceptions=True
        )
        wins = [r for r in results if isinstance(r, int)]
        assert len(wins) == 1 and sum(isinstance(r, RunVersionConflict) for r in results) == 1, results
        seq = wins[0]
        _, last = await journal.read(run_id)
        assert last == seq
    # Each went to its class's subject; a reader of the run sees both, in order.
    stored = await broker.read_subject(namespace.stream(StreamKind.RUNS), namespace.run_events(run_id))
    subjects = {m.subject.rsplit(".", 1)[-1] for m in stored}
    assert (
        subjects <= {EventClass.STEP.value, EventClass.MILESTONE.value} and EventClass.STEP.value in subjects
    )
    after = RunCompleted(run_id=run_id, at=now, reply="late")
    appended = await journal.append(after, seq, after_end=True)
    last = await broker.last_on_subject(namespace.stream(StreamKind.RUNS), namespace.run_events(run_id))
    assert last is not None and (last.seq, last.subject) == (
        appended,
        namespace.run_event(run_id, EventClass.MILESTONE),
    )


async def test_a_journal_is_read_whole_or_after_a_sequence_and_nothing_new_is_not_read(
    broker: Broker, namespace: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal in order, from any sequence on; a reader that read it to its end asks its last sequence and reads
    nothing more (a batched read costs nats-server a look to the stream's end)."""
    await ensure_streams(broker, namespace)
    journal = RunJournal(broker, namespace)
    run_id = "run_" + uuid.uuid4().hex[:24]
    now = datetime.now(UTC)
    seq = await journal.append(_started(run_id, now), 0)
    for step in range(1, 4):
        answer = ModelAnswered(
            run_id=run_id, at=now, step_no=step, model="m", response_id=f"r{step}", reply="x"
        )
        seq = await journal.append(answer, seq)
    await journal.append(RunCompleted(run_id=run_id, at=now, reply="done"), seq)
    seqs = [m.seq for m in await journal.stored(run_id)]
    assert len(seqs) == 5 and seqs == sorted(seqs)
    assert [m.seq for m in await journal.stored(run_id, seqs[1])] == seqs[2:]
    batched: list[str] = []
    read_subject = broker.read_subject

    async def counted(stream: str, subject: str, after_seq: int = 0, batch: int = 256) -> list[StoredMessage]:
        batched.append(subject)
        return await read_subject(stream, subject, after_seq, batch)

    monkeypatch.setattr(broker, "read_subject", counted)
    assert await journal.stored(run_id, seqs[-1]) == [] and batched == []
    assert await journal.read_after("run_" + uuid.uuid4().hex[:24], 7) == [] and batched == []
