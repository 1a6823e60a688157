"""The corpus recorder keeps working (tests/corpus/record.py, `just record-corpus`): a recording made now, on a
whole stack whose runtime is SIGKILLed mid-payment, replays under this code with no divergence, and the email and
CRM record its projections sent are held by the receivers once each."""

from __future__ import annotations

import json
from pathlib import Path

from crashsafe.contracts.run_events import RunResumed
from crashsafe.domain import registry as registries
from crashsafe.export_file import decode_journal, read_export
from crashsafe.replay_check import divergences, recorded_views
from tests.corpus.record import DELIVERED, VIEWS, record


async def test_a_fresh_recording_of_a_killed_and_resumed_booking_replays_without_divergence(
    tmp_path: Path,
) -> None:
    assert await record("booking_runtime_killed_resumed", tmp_path) == 0
    (path,) = tmp_path.glob("*.jsonl")
    export = read_export(path.read_bytes())
    assert export.header is not None and export.header.registry
    journal = decode_journal(export.events)
    assert any(isinstance(e, RunResumed) for e in journal)
    agent = registries.load(export.header.registry).agent(journal[0].agent)  # type: ignore[union-attr]
    assert divergences(journal, agent, export.header.config) == []
    keys = json.loads((tmp_path / DELIVERED).read_text())[path.stem]
    assert len(keys["send_confirmation_email"]) == 1 and len(keys["update_crm"]) == 1
    # What the run showed the model and the caller, kept beside the journal for the corpus test.
    views = json.loads((tmp_path / VIEWS).read_text())
    assert views == {path.stem: recorded_views(journal)} and views[path.stem]["asks"]
