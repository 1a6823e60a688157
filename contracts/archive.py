"""An ended run's journal as the archive keeps it once its subjects are purged from `<ns>_RUNS`: a durable format
(msgspec JSON, language-neutral), read by every reader of a run that falls back to the archive.

One object per run, named from the run id alone (`archive_name`), so the gateway's dedup asks for exactly one name.
Each event is kept as the bytes the journal stored (`event`, the run event's own JSON, embedded as is), with the
stream sequence, subject class and headers it had: an export or an API read of an archived run is byte for byte
the one before the purge. Evolution as every contract: fields are only added, with defaults."""

from __future__ import annotations

from datetime import datetime

import msgspec

from crashsafe.contracts.subjects import Namespace

ARCHIVE_FORMAT = 1
# The first release whose every reader of a journal falls back to the archive: no run is purged while a process
# of an older release is alive, nor before the namespace was contracted to this release or a later one (an older
# release rolled back to would take a purged run for a new one).
ARCHIVE_SINCE = "0.3.0"


def archive_name(namespace: str, run_id: str) -> str:
    """The object a run's journal is archived under: `<ns>/runs/<run_id>.json` (a run id is one subject token)."""
    return f"{namespace}/runs/{run_id}.json"


def purge_filter(ns: Namespace, run_id: str) -> str:
    """Every subject of one run's journal, `<ns>.run.<run_id>.>`: what is purged once its archive is read back."""
    return ns.run_events(run_id)


class ArchivedEvent(msgspec.Struct, frozen=True, kw_only=True):
    seq: int  # its sequence in `<ns>_RUNS`: readers answer it as the event's `seq`, as before the purge
    subject: str  # `<ns>.run.<run_id>.step|milestone`: the class it was journaled under
    stored_at: str = ""  # the server's timestamp (`Nats-Time-Stamp`), as stored
    headers: dict[str, str] = {}  # the headers it was appended with (trace context, `Crashsafe-Run-Ended`, …)
    event: msgspec.Raw  # the run event's JSON, exactly as journaled


class ArchivedJournal(msgspec.Struct, frozen=True, kw_only=True):
    """One run's whole journal, as the archiver read it from the stream before purging it."""

    format: int = ARCHIVE_FORMAT  # this layout's version: a reader refuses one it does not know
    run_id: str  # the run: the object's name says it too, and a reader checks the two agree
    namespace: str  # the deployment's namespace the journal was in
    archived_at: datetime  # when the archiver wrote it (its pass's clock)
    archived_by: str  # the release and worker that wrote it (`0.3.0 reconciler:w1`)
    events: list[ArchivedEvent]


archive_encoder = msgspec.json.Encoder()
archive_decoder = msgspec.json.Decoder(ArchivedJournal)
