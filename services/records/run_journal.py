"""The run journal on JetStream: read a run's events in order, append one with optimistic concurrency."""

from __future__ import annotations

from crashsafe.contracts.run_events import (
    JournalEvent,
    RunEvent,
    decode_event,
    event_class,
    event_encoder,
    event_type,
)
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage


class RunJournal:
    """Append-only events per run on `<ns>.run.<run_id>.<class>`; the last sequence across them is the run's
    version."""

    def __init__(self, broker: Broker, ns: Namespace) -> None:
        self.broker = broker
        self.ns = ns
        self.stream = ns.stream(StreamKind.RUNS)

    async def read(self, run_id: str) -> tuple[list[JournalEvent], int]:
        """The run's events and the stream sequence of the last one (0 for a run that does not exist).

        Decoded tolerantly: an event type a newer writer added comes back as an `UnknownEvent`, never an error."""
        stored = await self.stored(run_id)
        events = [decode_event(m.data) for m in stored]
        return events, (stored[-1].seq if stored else 0)

    async def read_with_seqs(self, run_id: str) -> list[tuple[int, JournalEvent]]:
        return [(m.seq, decode_event(m.data)) for m in await self.stored(run_id)]

    async def read_after(self, run_id: str, after_seq: int) -> list[tuple[int, JournalEvent]]:
        """The run's events stored after stream sequence `after_seq`, each with its sequence (a reader that read
        the journal before reads on from where it stopped)."""
        return [(m.seq, decode_event(m.data)) for m in await self.stored(run_id, after_seq)]

    async def stored(self, run_id: str, after_seq: int = 0) -> list[StoredMessage]:
        """The run's journal as stored (after stream sequence `after_seq`), in order: always a prefix of it. Every
        journal read in the product goes through here.

        One read across the run's subjects, continued batch by batch from the last sequence read: whichever replica
        answers a batch (direct gets), a lagging one only ends the prefix early, and an append decided on it meets
        the journal's real version. (Reading one event class at a time is cheaper for nats-server on a run far back
        in a long stream, but two replicas could answer the two classes at two points in time: a hole an append
        could pass. Measured and rejected: docs/decisions.md.) A read after a sequence asks the journal's last
        sequence first (one lookup in the server's subject index): a journal with nothing new is not read."""
        if after_seq:
            last = await self.broker.last_on_subject(self.stream, self.ns.run_events(run_id))
            if last is None or last.seq <= after_seq:
                return []
        return await self.broker.read_subject(self.stream, self.ns.run_events(run_id), after_seq=after_seq)

    async def read_all(self) -> dict[str, list[JournalEvent]]:
        """Every run's journal, grouped by run (for audits and manual reconciliation; not for the hot path)."""
        runs: dict[str, list[JournalEvent]] = {}
        for message in await self.broker.read_subject(self.stream, self.ns.run_events_all, batch=1000):
            event = decode_event(message.data)
            runs.setdefault(event.run_id, []).append(event)
        return runs

    async def append(
        self,
        event: RunEvent,
        expected_seq: int,
        headers: dict[str, str] | None = None,
        *,
        after_end: bool = False,
    ) -> int:
        """Append only if the run is still at `expected_seq`; raises RunVersionConflict otherwise. `after_end`: the
        run had ended before this event (it is journaled as a milestone, whatever its type)."""
        published = await self.broker.publish(
            self.ns.run_event(event.run_id, event_class(event_type(event), after_end)),
            event_encoder.encode(event),
            expected_subject_seq=expected_seq,
            sequence_subject=self.ns.run_events(event.run_id),
            headers=headers,
        )
        return published.seq
