"""The runtime's signed checkpoints (issue 34): every run head it moved, signed in batches on a stream of its own.

Each append notes its run's new head; once a second (and on the way out) the heads noted since are signed as one
checkpoint, chained after the last checkpoint on `<ns>.checkpoint.runs` with an expected-last-sequence publish, so
replicas take turns and none of them can leave a gap or a fork. A checkpoint that could not be published keeps its
heads for the next turn; a crash loses at most the heads of its last second, which the next append of each run
(or `crashsafe verify --live`, which names every run whose last events no checkpoint covers) brings back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from crashsafe.contracts.capabilities import CapabilityIssuer
from crashsafe.contracts.checkpoints import (
    FIRST_PREV,
    RunHead,
    checkpoint_encoder,
    stored_hash,
)
from crashsafe.contracts.errors import BrokerUnavailable, RunVersionConflict
from crashsafe.contracts.journal_chain import ChainHead
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log

INTERVAL_S = 1.0
# A checkpoint holds at most this many heads (a busy second is signed in several): about 100 bytes each.
MAX_HEADS = 2000
# Another replica's checkpoint between our read of the last and our publish: read again, try again.
MAX_TURNS = 8


class RunCheckpoints:
    def __init__(
        self, broker: Broker, ns: Namespace, issuer: CapabilityIssuer, logger: logging.Logger
    ) -> None:
        self.broker = broker
        self.ns = ns
        self.issuer = issuer
        self.logger = logger
        self.subject = ns.checkpoints
        self.stream = ns.stream(StreamKind.CHECKPOINTS)
        self.pending: dict[str, RunHead] = {}
        self._last: tuple[int, str] | None = None  # (stream sequence, hash) of the last checkpoint, once read
        self._task: asyncio.Task[None] | None = None

    def note(self, run_id: str, head: ChainHead) -> None:
        """The run's journal now ends at `head`: signed in the next checkpoint."""
        self.pending[run_id] = RunHead(run_id, head.position, head.hash)

    def start(self, interval_s: float = INTERVAL_S) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._every(interval_s), name="run-checkpoints")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        """Stop signing on a timer and sign what is noted (a clean shutdown leaves no head unsigned): a turn the
        timer had begun gives its heads back before the last one is signed."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()

    async def _every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 -- signing must outlive any one failure; the heads wait
                log(self.logger, logging.ERROR, "checkpoint not signed; kept for the next", error=repr(exc))

    async def flush(self) -> None:
        """Sign and publish the heads noted until now (those noted meanwhile wait for the next turn: one
        checkpoint a turn, however busy). What was not published is kept, whatever stopped it (a cancelled
        shutdown included), unless its run moved on meanwhile."""
        taken, self.pending = self.pending, {}
        heads, done = list(taken.values()), 0
        try:
            while done < len(heads):
                chunk = heads[done : done + MAX_HEADS]
                await self._publish(chunk)
                done += len(chunk)
        except (BrokerUnavailable, RunVersionConflict) as exc:
            log(self.logger, logging.WARNING, "checkpoint not published; kept for the next", error=repr(exc))
        finally:
            for head in heads[done:]:
                self.pending.setdefault(head.run_id, head)

    async def _publish(self, heads: list[RunHead]) -> None:
        for _ in range(MAX_TURNS):
            seq, prev = self._last if self._last is not None else await self._read_last()
            checkpoint = self.issuer.checkpoint(heads, prev, datetime.now(UTC))
            data = checkpoint_encoder.encode(checkpoint)
            try:
                published = await self.broker.publish(self.subject, data, expected_subject_seq=seq)
            except RunVersionConflict:
                self._last = None  # another replica's checkpoint came first: ours goes after it
                continue
            self._last = (published.seq, stored_hash(data))
            return
        raise RunVersionConflict(subject=self.subject, expected_seq=self._last[0] if self._last else 0)

    async def _read_last(self) -> tuple[int, str]:
        last = await self.broker.last_on_subject(self.stream, self.subject)
        return (0, FIRST_PREV) if last is None else (last.seq, stored_hash(last.data))
