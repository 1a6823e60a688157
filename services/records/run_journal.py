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
        stored = await self.broker.read_subject(self.stream, self.ns.run_events(run_id))
        events = [decode_event(m.data) for m in stored]
        return events, (stored[-1].seq if stored else 0)

    async def read_with_seqs(self, run_id: str) -> list[tuple[int, JournalEvent]]:
        stored = await self.broker.read_subject(self.stream, self.ns.run_events(run_id))
        return [(m.seq, decode_event(m.data)) for m in stored]

    async def read_after(self, run_id: str, after_seq: int) -> list[tuple[int, JournalEvent]]:
        """The run's events stored after stream sequence `after_seq`, each with its sequence (a reader that read
        the journal before reads on from where it stopped). Its last sequence is asked first (one lookup in the
        server's subject index): a batched read scans the stream from the run's events to its end, 0.6-1.3 ms
        of nats-server's CPU on a stream of 220,000 messages, and a journal with nothing new needs none."""
        last = await self.broker.last_on_subject(self.stream, self.ns.run_events(run_id))
        if last is None or last.seq <= after_seq:
            return []
        stored = await self.broker.read_subject(self.stream, self.ns.run_events(run_id), after_seq=after_seq)
        return [(m.seq, decode_event(m.data)) for m in stored]

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
