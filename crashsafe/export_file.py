"""The export file: a run's journal as JSON Lines behind a header with its pinned configuration, as bytes.

Export format (JSON Lines; why, in docs/decisions.md): a first header line
`{"type": "crashsafe.export", "format": 1, "run_id", "catalog_revision", "config", "registry"}` carrying the
agent's configuration at the run's pinned catalog revision (what `next_move` needs, and what an offline machine
cannot read from the catalog bucket) and the registry that ran it, then every journaled event, one per line,
byte for byte as the RUNS stream holds it. A file without the header (a plain journal) replays too, under the
agent's built-in configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from crashsafe.contracts.evidence import EXPORT_FORMAT, EXPORT_TYPE, ExportHeader
from crashsafe.contracts.run_events import JournalEvent, RunStarted, UnknownEvent, decode_event

_header_encoder = msgspec.json.Encoder(order="sorted")


_header_decoder = msgspec.json.Decoder(ExportHeader)


@dataclass(frozen=True, slots=True)
class Export:
    header: ExportHeader | None
    events: tuple[bytes, ...]  # each as journaled


class BadExport(ValueError):
    """A file that is not an export or a journal: says which line and why."""


def export_lines(header: ExportHeader, events: Iterable[bytes]) -> bytes:
    return b"".join([_header_encoder.encode(header) + b"\n", *(e + b"\n" for e in events)])


class _Kind(msgspec.Struct):
    type: str = ""


def _kind(line: bytes) -> str:
    """The `type` of a JSON object line ("" if it has none or is not one): a header is told by its type, never by
    a substring (a guest's text may spell anything)."""
    try:
        return msgspec.json.decode(line, type=_Kind).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


def read_export(raw: bytes) -> Export:
    """An export file (header, then events) or a plain journal; `BadExport` names the first line that is wrong."""
    lines = [line for line in raw.splitlines() if line.strip()]
    header: ExportHeader | None = None
    if lines and _kind(lines[0]) == EXPORT_TYPE:
        try:
            header = _header_decoder.decode(lines[0])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadExport(f"line 1: not an export header: {exc}") from exc
        if header.format != EXPORT_FORMAT:
            raise BadExport(f"line 1: export format {header.format}; this version reads {EXPORT_FORMAT}")
        lines = lines[1:]
    events = decode_journal(lines, first_line=2 if header else 1)
    if header is not None and events and events[0].run_id != header.run_id:
        raise BadExport(f"line 1: the header names run {header.run_id}, its events are of {events[0].run_id}")
    return Export(header, tuple(lines))


def decode_journal(raw: Sequence[bytes], first_line: int = 0) -> list[JournalEvent]:
    """Every event, decoded as the runtime decodes it (an unknown type kept); a corrupt one, or a journal that
    does not open with run.started, is `BadExport` naming the file's line (`first_line`) or the journal position."""
    events: list[JournalEvent] = []
    for i, line in enumerate(raw):
        where = f"line {first_line + i}" if first_line else f"position {i + 1}"
        try:
            events.append(decode_event(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadExport(f"{where}: not a run event: {exc}") from exc
        if i == 0 and not isinstance(events[0], RunStarted):
            raise BadExport(f"{where}: a run's journal opens with run.started, not {event_type(events[0])}")
        # One run's journal (the runtime reads it by subject): another run's event spliced in would fold into a
        # state no runtime ever had. (A second run.started is folded as the runtime folds it: tolerated.)
        if i > 0 and events[i].run_id != events[0].run_id:
            raise BadExport(
                f"{where}: an event of run {events[i].run_id} in the journal of {events[0].run_id}"
            )
    return events


def event_type(event: JournalEvent) -> str:
    if isinstance(event, UnknownEvent):
        return event.type
    return str(type(event).__struct_config__.tag)
