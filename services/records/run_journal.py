"""The run journal on JetStream: read a run's events in order, append one with optimistic concurrency. A run whose
journal was archived and purged from the stream is read from the archive (`stored`, `first`), never appended to."""

from __future__ import annotations

import msgspec

from crashsafe.contracts.archive import archive_decoder
from crashsafe.contracts.errors import ArchiveUnavailable, RunArchived
from crashsafe.contracts.journal_bus import read_event
from crashsafe.contracts.journal_chain import ChainHead, head_of, in_namespace
from crashsafe.contracts.run_events import (
    JournalEvent,
    RunEvent,
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

    def event(self, message: StoredMessage) -> JournalEvent:
        """A stored message as the run's event: a receipt only as its subject's family wrote it (`read_event`)."""
        return read_event(message.data, self.ns.receipt_writer(message.subject))

    async def read(self, run_id: str) -> tuple[list[JournalEvent], int]:
        """The run's events and the stream sequence of the last one (0 for a run that does not exist).

        Decoded tolerantly: an event type a newer writer added comes back as an `UnknownEvent`, never an error."""
        stored = await self.stored(run_id)
        events = [self.event(m) for m in stored]
        return events, (stored[-1].seq if stored else 0)

    async def read_with_seqs(self, run_id: str) -> list[tuple[int, JournalEvent]]:
        return [(m.seq, self.event(m)) for m in await self.stored(run_id)]

    async def read_after(self, run_id: str, after_seq: int) -> list[tuple[int, JournalEvent]]:
        """The run's events stored after stream sequence `after_seq`, each with its sequence (a reader that read
        the journal before reads on from where it stopped). The stream's only: a reader following a live run."""
        return [(m.seq, self.event(m)) for m in await self.live(run_id, after_seq)]

    async def writable(
        self, run_id: str, what: str = "a message"
    ) -> tuple[list[JournalEvent], int, ChainHead]:
        """The run's events, last sequence and chain head, to append after: the stream's alone. A run that has none
        there but was archived raises RunArchived (`what` names the message, for its dead letter): an append at
        sequence 0 on its purged subject would start a half journal under an ended run's id."""
        stored = await self.live(run_id)
        if not stored:
            await self.refuse_archived(run_id, what)
        head = head_of((in_namespace(self.ns.name, m.subject), m.data) for m in stored)
        return [self.event(m) for m in stored], (stored[-1].seq if stored else 0), head

    async def refuse_archived(self, run_id: str, what: str = "a message") -> None:
        """RunArchived if the run's journal is in the archive (nothing where no archive is configured)."""
        archive = self.broker.archive
        if archive is not None and await archive.exists(run_id):
            raise RunArchived(run_id=run_id, archive=archive.name(run_id), what=what)

    async def first(self, run_id: str) -> StoredMessage | None:
        """The run's first event (its `run.started`), from the stream, else the archive; None: no such run."""
        found = await self.broker.first_on_subject(self.stream, self.ns.run_events(run_id))
        if found is None:
            archived = await self.archived(run_id)
            return archived[0] if archived else None
        return found

    async def stored(self, run_id: str, after_seq: int = 0) -> list[StoredMessage]:
        """The run's journal as stored (after stream sequence `after_seq`), in order: always a prefix of it; for a
        run archived and purged, the archive's copy, with the sequences it had. Every journal read in the product
        goes through here (the append path reads the stream alone: `writable`)."""
        stored = await self.live(run_id, after_seq)
        if stored or after_seq:
            return stored
        return await self.archived(run_id)

    async def archived(self, run_id: str) -> list[StoredMessage]:
        """The run's journal from the archive ([]: no archive, or the run is not in it)."""
        archive = self.broker.archive
        data = await archive.get(run_id) if archive is not None else None
        if data is None:
            return []
        assert archive is not None
        try:
            journal = archive_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise ArchiveUnavailable(
                f"{archive.name(run_id)} does not decode ({exc}); the stream no longer holds this run: restore"
                " the object from the volume's backup",
                archive=archive.name(run_id),
            ) from exc
        if journal.run_id != run_id:
            raise ArchiveUnavailable(
                f"{archive.name(run_id)} holds run {journal.run_id}, not {run_id}",
                archive=archive.name(run_id),
            )
        return [StoredMessage(e.seq, e.subject, bytes(e.event), dict(e.headers)) for e in journal.events]

    async def live(self, run_id: str, after_seq: int = 0) -> list[StoredMessage]:
        """The run's journal in the stream (after stream sequence `after_seq`), in order: always a prefix of it.

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
        """Every run's journal in the stream, grouped by run (for audits and manual reconciliation; not for the hot
        path). An archived run is not among them: it is read by its id (`stored`)."""
        runs: dict[str, list[JournalEvent]] = {}
        for message in await self.broker.read_subject(self.stream, self.ns.run_events_all, batch=1000):
            event = self.event(message)
            runs.setdefault(event.run_id, []).append(event)
        return runs

    async def read_all_archived(self) -> dict[str, list[JournalEvent]]:
        """Every archived run's journal, grouped by run ({} without an archive): for the audit, whose providers
        still hold the effects of runs long archived. Read one object at a time: not for the hot path."""
        archive = self.broker.archive
        runs: dict[str, list[JournalEvent]] = {}
        for run_id in await archive.runs() if archive is not None else []:
            runs[run_id] = [self.event(m) for m in await self.archived(run_id)]
        return runs

    def subject_for(self, event: RunEvent, after_end: bool = False) -> str:
        """Where `append` puts `event` when no subject is given: its class's subject in its run."""
        return self.ns.run_event(event.run_id, event_class(event_type(event), after_end))

    async def append(
        self,
        event: RunEvent,
        expected_seq: int,
        headers: dict[str, str] | None = None,
        *,
        after_end: bool = False,
        subject: str | None = None,
    ) -> int:
        """Append only if the run is still at `expected_seq`; raises RunVersionConflict otherwise. `after_end`: the
        run had ended before this event (it is journaled as a milestone, whatever its type). `subject`: where the
        event stands if not on its class's (an intent for the bus, on its executor's). The event's link in its run's
        hash chain, if any, is one of the `headers` (the runtime's append path sends it: `RunAppends._append`)."""
        published = await self.broker.publish(
            subject or self.subject_for(event, after_end),
            event_encoder.encode(event),
            expected_subject_seq=expected_seq,
            sequence_subject=self.ns.run_events(event.run_id),
            headers=headers,
        )
        return published.seq
