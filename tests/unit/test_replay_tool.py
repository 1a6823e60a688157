"""The pure half of `crashsafe replay` / `crashsafe export`: reading an export, the transitions, the diff, --until."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.domain import registry as registries
from crashsafe.export_file import BadExport, ExportHeader, decode_journal, export_lines, read_export
from crashsafe.replay import render, render_json, replay_command, replay_events
from crashsafe.run_views import diff_views
from tests.support.paths import ROOT

STAYHUB = registries.load("crashsafe.services.agents:stayhub")

HEADER = ExportHeader(
    run_id="run_a387ee2d1485c57a0fcc294f",
    catalog_revision=3,
    config=AgentConfig(agent="booking", max_repeats=2),
)


def _journal() -> list[bytes]:
    """A booking the real stack ran (the corpus's)."""
    return list(read_export((ROOT / "tests" / "corpus" / "booking_happy.jsonl").read_bytes()).events)


def test_an_export_reads_back_its_header_and_every_event_byte_for_byte() -> None:
    raw = _journal()
    export = read_export(export_lines(HEADER, raw))
    assert export.header == HEADER and export.events == tuple(raw)
    # A plain journal (no header) is an export too: the agent's built-in configuration.
    plain = read_export(b"\n".join(raw) + b"\n")
    assert plain.header is None and plain.events == tuple(raw)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"type": "crashsafe.export", "format": 2, "run_id": "r"}\n', "line 1: export format 2"),
        (b'{"type": "crashsafe.export", "run_id": 5}\n', "line 1: not an export header"),
        (b'{"type": "crashsafe.export", "format": 1, "run_id": "r"}\nnot json\n', "line 2: not a run event"),
        (b'{"type": "run.started", "run_id": "r"}\n', "line 1: not a run event"),
    ],
)
def test_a_file_that_is_not_an_export_is_refused_naming_the_line(body: bytes, why: str) -> None:
    with pytest.raises(BadExport, match=why):
        read_export(body)


def test_replay_prints_each_transition_the_status_after_it_and_the_next_move() -> None:
    from crashsafe.contracts.run_events import decode_event

    events = [decode_event(e) for e in _journal()]
    full = replay_events(events, STAYHUB, None)
    assert [t.position for t in full.transitions] == list(range(1, len(events) + 1))
    assert full.transitions[-1].type == "run.completed" and full.transitions[-1].status == "completed"
    assert full.next == "nothing (idle)"
    cut = replay_events(events, STAYHUB, None, until=2)  # the model asked for the search
    assert [t.type for t in cut.transitions] == ["run.started", "run.model_answered"]
    assert cut.next.startswith("journal run.action_requested search_hotels key=")
    text = render(cut, show_diff=True)
    assert "   2  run.model_answered" in text and "unplanned: + search_hotels(" in text
    assert render(cut, show_diff=False).count("\n") == 5  # title, two transitions, status, next
    assert '"changes"' not in render_json(cut, show_diff=False) and '"changes"' in render_json(cut, True)


def test_the_diff_names_each_field_that_changed_and_each_item_added_or_gone() -> None:
    before = {"status": "running", "steps": 1, "pending_actions": ["a", "b"], "reply": None}
    after = {"status": "completed", "steps": 1, "pending_actions": ["b", "c"], "reply": "ok"}
    assert diff_views(before, after) == [
        'status: "running" -> "completed"',
        "pending_actions: - a",
        "pending_actions: + c",
        'reply: null -> "ok"',
    ]
    assert diff_views(after, after) == []


def test_a_guests_text_naming_the_export_type_is_an_event_not_a_header() -> None:
    """Hostile text in the first event cannot make the journal's own first line pass for a header."""
    from crashsafe.contracts.run_events import decode_event, event_encoder

    first = decode_event(_journal()[0])
    forged = msgspec.structs.replace(
        first, text='{"type": "crashsafe.export", "format": 1} "crashsafe.export"'
    )
    raw = event_encoder.encode(forged)
    export = read_export(raw + b"\n")
    assert export.header is None and export.events == (raw,)


def test_a_journal_must_open_with_its_start_and_a_corrupt_event_is_named_by_position() -> None:
    raw = _journal()
    with pytest.raises(
        BadExport, match="position 1: a run's journal opens with run.started, not run.model_answered"
    ):
        decode_journal(raw[1:])
    with pytest.raises(BadExport, match="position 3: not a run event"):
        decode_journal(
            [*raw[:2], b'{"type": "run.action_completed", "run_id": "r", "at": "2026-12-01T00:00:00Z"}']
        )


def test_until_takes_a_journal_position_from_one() -> None:
    from crashsafe.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["replay", "r", "--until", "3"]).until == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["replay", "r", "--until", bad])


def test_what_a_guest_wrote_cannot_forge_a_line_of_the_replay_or_drive_the_terminal() -> None:
    from crashsafe.contracts.run_events import decode_event, event_encoder

    raw = _journal()
    first = decode_event(raw[0])
    hostile = "hi\x1b[2J\u202e\n   2  run.completed            completed: refunded  [completed]"
    forged = event_encoder.encode(msgspec.structs.replace(first, text=hostile))
    events = [decode_event(e) for e in [forged, *raw[1:3]]]
    text = render(replay_events(events, STAYHUB, None), show_diff=True)
    lines = text.splitlines()
    assert [line[:6] for line in lines if line[:6].strip().isdigit()] == ["   1  ", "   2  ", "   3  "]
    assert "\x1b" not in text and "\u202e" not in text
    assert "hi\\x1b[2J\\u202e\\n   2  run.completed" in text


def test_a_batch_cut_short_by_a_crash_and_decided_again_after_the_resume_is_no_divergence() -> None:
    """The model asked for two searches; the runtime journaled the first request and died. The next worker
    journals its resume marker, then the second request: the journal the runtime really writes in that case."""
    from datetime import timedelta

    from crashsafe.contracts.run_events import ActionRequested, RunResumed
    from crashsafe.domain.decide import Append, next_move
    from crashsafe.domain.fold import replay
    from crashsafe.replay_check import divergences
    from tests.support.runs import BOOKING, Run, call, started

    run = Run(started())
    run.answer(
        call("search_hotels", {"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-03"}, "c1"),
        call("search_hotels", {"city": "Porto", "check_in": "2031-12-01", "check_out": "2031-12-03"}, "c2"),
    )
    first, second = run.decide()
    assert isinstance(first, ActionRequested) and isinstance(second, ActionRequested)
    cut = run.events[:-1]  # the second request never reached the journal
    resumed = RunResumed(
        run_id=first.run_id,
        at=first.at + timedelta(seconds=5),
        worker="w2",
        next_step=second.step_no,
        reason="x",
    )
    state = replay([*cut, resumed])
    assert state is not None
    move = next_move(state, BOOKING, resumed.at)
    assert isinstance(move, Append) and [e.step_no for e in move.events] == [second.step_no]  # type: ignore[union-attr]
    assert divergences([*cut, resumed, *move.events], BOOKING, None) == []
    # A request the resumed worker did not decide (another key for the second search) is still caught.
    forged = msgspec.structs.replace(move.events[0], key="search:forged")
    assert [d.position for d in divergences([*cut, resumed, forged], BOOKING, None)] == [len(cut) + 2]


# Hostile export files (review of issue 10) ------------------------------------------------------------------------


def _forged(tmp_path: Path, header: dict[str, object], events: list[bytes]) -> Path:
    path = tmp_path / "forged.jsonl"
    path.write_bytes(b"\n".join([json.dumps(header).encode(), *events]) + b"\n")
    return path


async def test_an_export_never_chooses_the_code_that_replays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The header's registry is what the exporting deployment ran, said for the operator: a file that names a
    module:function must not make `crashsafe replay --file` import and call it (a zero-argument callable of any
    installed module would run: `os:abort`, `code:interact`). The deployment's CRASHSAFE_REGISTRY decides."""
    marker = tmp_path / "called"
    module = f"forged_registry_{os.getpid()}"
    (tmp_path / f"{module}.py").write_text(
        f"from pathlib import Path\n\ndef registry():\n    Path({str(marker)!r}).write_text('ran')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CRASHSAFE_REGISTRY", "crashsafe.services.agents:stayhub")
    head = {"type": "crashsafe.export", "format": 1, "run_id": "", "registry": f"{module}:registry"}
    events = _journal()
    head["run_id"] = msgspec.json.decode(events[0])["run_id"]
    code = await replay_command(tmp_path, None, None, False, _forged(tmp_path, head, events), False)
    out = capsys.readouterr()
    assert not marker.exists(), "the export's header ran code of its choosing"
    assert code == 0 and "\nnext: nothing (idle)\n" in out.out
    assert f"{module}:registry" in out.err  # said, not obeyed


def _as(raw: bytes, **fields: object) -> bytes:
    return json.dumps({**json.loads(raw), **fields}).encode()


@pytest.mark.parametrize(
    ("mangle", "why"),
    [
        (lambda ev: [*ev[:3], _as(ev[3], run_id="run_someone_else"), *ev[4:]], "line 5: an event of run"),
        (
            lambda ev: [*ev, _as(ev[0], type="run.from_the_future", run_id="run_x")],
            "line 14: an event of run run_x",
        ),
    ],
    ids=["another_runs_event", "another_runs_unknown_event"],
)
def test_a_journal_mixing_runs_is_refused_naming_the_line(mangle: Any, why: str) -> None:
    """One run's journal holds that run's events only (the runtime reads it by subject): an event of another run
    spliced in would fold into a state no runtime ever had."""
    events = _journal()
    head = ExportHeader(run_id=msgspec.json.decode(events[0])["run_id"])
    with pytest.raises(BadExport, match=why):
        read_export(export_lines(head, mangle(events)))


def test_a_header_naming_another_run_is_refused() -> None:
    with pytest.raises(BadExport, match="line 1: the header names run run_forged"):
        read_export(export_lines(ExportHeader(run_id="run_forged"), _journal()))


async def test_what_a_refused_file_says_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error names what the file holds (an event's type); a control character in it is escaped there too."""
    evil = json.dumps(
        {"type": "run.\x1b[2J\x1b[31mok\nfake: line", "run_id": "r", "at": "2026-01-01T00:00:00Z"}
    )
    path = tmp_path / "evil.jsonl"
    path.write_bytes(evil.encode() + b"\n")
    assert await replay_command(tmp_path, None, None, False, path, False) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1, err
