"""The console's pure half: every recorded journal becomes entries with their facts, the evidence of a recovered
receipt is kept, the runs filter, and every template escapes what a caller or a model wrote."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from msgspec.structs import replace

from crashsafe.contracts.run_events import JournalEvent, RunStarted, UnknownEvent, decode_event
from crashsafe.export_file import read_export
from crashsafe.services.console.console_router import templates
from crashsafe.services.console.run_timeline import entry, trace_id_of
from crashsafe.services.operations.run_index import RunFilter, RunRow
from tests.support.paths import ROOT
from tests.support.runs import T0, started

CORPUS = sorted((ROOT / "tests" / "corpus").glob("*.jsonl"))
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def _journal(name: str) -> list[JournalEvent]:
    return [
        decode_event(line) for line in read_export((ROOT / "tests" / "corpus" / name).read_bytes()).events
    ]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_recorded_journal_renders_one_entry_per_event_in_order(path: Path) -> None:
    events = _journal(path.name)
    first = events[0]
    assert isinstance(first, RunStarted)
    entries = [entry(i + 1, e, first.at) for i, e in enumerate(events)]
    html = templates.get_template("run_entries.html").render(
        prefix="/console", entries=entries, summary={"status": "completed"}, trace_id=""
    )
    assert [e.seq for e in entries] == list(range(1, len(events) + 1))
    assert all(e.kind != "unknown" for e in entries), [e.label for e in entries if e.kind == "unknown"]
    assert all(e.offset_s >= 0 for e in entries)
    assert html.count('<tr class="evt ') == len(events)


def test_a_receipt_recovered_by_lookup_keeps_its_whole_evidence_trail() -> None:
    events = _journal("booking_unknown_resolved_by_lookup.jsonl")
    first = events[0]
    assert isinstance(first, RunStarted)
    recovered = [
        entry(i + 1, e, first.at) for i, e in enumerate(events) if getattr(e, "via", "") == "provider_lookup"
    ]
    assert recovered, "the corpus journal has a receipt recovered by lookup"
    (shown,) = recovered
    source = next(e for e in events if getattr(e, "via", "") == "provider_lookup")
    assert shown.kind == "recovered"
    assert shown.evidence == source.evidence  # type: ignore[attr-defined]
    assert ("key", source.key) in shown.facts  # type: ignore[attr-defined]
    assert "RECOVERED by provider lookup" in shown.summary


def test_intents_name_their_key_and_compensations_stand_out() -> None:
    events = _journal("booking_declined_released.jsonl")
    first = events[0]
    assert isinstance(first, RunStarted)
    entries = [entry(i + 1, e, first.at) for i, e in enumerate(events)]
    intents = [e for e in entries if e.kind in ("intent", "compensation")]
    assert intents and all(any(k == "key" for k, _ in e.facts) for e in intents)
    assert any(e.kind == "compensation" for e in entries), "a declined payment releases the held room"


def test_an_event_this_version_does_not_know_is_shown_as_journaled() -> None:
    unknown = UnknownEvent(type="run.from_the_future", run_id="r", at=T0, data=b'{"x":1}', step_no=4)
    shown = entry(9, unknown, T0 - timedelta(seconds=2))
    assert (shown.kind, shown.label, shown.step, shown.offset_s) == (
        "unknown",
        "run.from_the_future",
        "4",
        2.0,
    )
    assert shown.blocks == [("as journaled (this version does not know it)", '{"x":1}')]


def test_trace_ids_come_only_from_a_well_formed_traceparent() -> None:
    assert trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == (
        "4bf92f3577b34da6a3ce929d0e0e4736"
    )
    for bad in (None, "", "00-xyz-1-01", "00-<script>aaaaaaaaaaaaaaaaaaaaaaaaaaa-1-01"):
        assert trace_id_of(bad) == ""


def test_the_run_page_escapes_guest_text_and_every_fact() -> None:
    hostile = replace(started(text=HOSTILE), guest_id=HOSTILE, session_id=HOSTILE, tenant=HOSTILE)
    html = templates.get_template("run_entries.html").render(
        prefix="/console", entries=[entry(1, hostile, T0)], summary={"status": HOSTILE}, trace_id=""
    )
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_runs_row_escapes_what_the_guest_chose() -> None:
    row = RunRow(
        run_id="run_0123456789abcdef01234567",
        agent="booking",
        guest_id=HOSTILE,
        tenant="acme",
        status="running",
        started_at=T0,
        ended_at=None,
        steps=0,
        events=1,
        session_id=HOSTILE,
    )
    html = templates.get_template("runs_row.html").render(prefix="/console", r=row, oob=True)
    assert "<script>" not in html and "<img" not in html
    assert 'hx-swap-oob="true"' in html


def test_the_runs_filter_keeps_a_tenants_runs_only_and_matches_every_field() -> None:
    run = started()
    row = RunRow(
        run_id=run.run_id,
        agent=run.agent,
        guest_id=run.guest_id,
        tenant="acme",
        status="completed",
        started_at=run.at,
        ended_at=run.at,
        steps=3,
        events=9,
        session_id=run.session_id,
    )
    acme = replace(run, tenant="acme")
    assert RunFilter(tenant="acme").passes(row) and RunFilter(tenant="acme").started(acme)
    assert not RunFilter(tenant="other").passes(row) and not RunFilter(tenant="other").started(acme)
    assert RunFilter(session=run.session_id, guest=run.guest_id, status="completed", since=T0).passes(row)
    assert not RunFilter(session="another").passes(row)
    assert not RunFilter(status="running").passes(row)
    assert not RunFilter(since=T0 + timedelta(seconds=1)).started(acme)
    assert not RunFilter().passes(None)
