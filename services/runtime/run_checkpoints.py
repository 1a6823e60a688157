"""The runtime's signed checkpoints (issue 34): every run head it moved, signed in batches on a stream of its own.

Each append notes its run's new head; once a second (and on the way out) the heads noted since are signed as one
checkpoint, chained after the last checkpoint on `<ns>.checkpoint.runs` with an expected-last-sequence publish, so
replicas take turns and none of them can leave a gap or a fork. A checkpoint that could not be published keeps its
heads for the next turn; a crash loses at most the heads of its last second, which the next append of each run
(or `crashsafe verify --live`, which names every run whose last events no checkpoint covers) brings back."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from crashsafe.contracts.capabilities import CapabilityIssuer
from crashsafe.contracts.checkpoints import (
    FIRST_PREV,
    RunHead,
    checkpoint_decoder,
    checkpoint_encoder,
    checkpoint_hash,
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
        """Stop signing on a timer and sign what is noted (a clean shutdown leaves no head unsigned)."""
        self.stop()
        await self.flush()

    async def _every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Sign and publish the heads noted so far; whatever could not be published waits for the next turn."""
        while self.pending:
            batch = dict(list(self.pending.items())[:MAX_HEADS])
            for run_id in batch:
                del self.pending[run_id]
            try:
                await self._publish(list(batch.values()))
            except (BrokerUnavailable, RunVersionConflict) as exc:
                # Kept, unless the run moved on meanwhile (its newer head is noted already).
                for run_id, head in batch.items():
                    self.pending.setdefault(run_id, head)
                log(
                    self.logger,
                    logging.WARNING,
                    "checkpoint not published; kept for the next",
                    error=repr(exc),
                )
                return

    async def _publish(self, heads: list[RunHead]) -> None:
        for _ in range(MAX_TURNS):
            seq, prev = self._last if self._last is not None else await self._read_last()
            checkpoint = self.issuer.checkpoint(heads, prev, datetime.now(UTC))
            try:
                published = await self.broker.publish(
                    self.subject, checkpoint_encoder.encode(checkpoint), expected_subject_seq=seq
                )
            except RunVersionConflict:
                self._last = None  # another replica's checkpoint came first: ours goes after it
                continue
            self._last = (published.seq, checkpoint_hash(checkpoint))
            return
        raise RunVersionConflict(subject=self.subject, expected_seq=self._last[0] if self._last else 0)

    async def _read_last(self) -> tuple[int, str]:
        last = await self.broker.last_on_subject(self.stream, self.subject)
        if last is None:
            return 0, FIRST_PREV
        return last.seq, checkpoint_hash(checkpoint_decoder.decode(last.data))
