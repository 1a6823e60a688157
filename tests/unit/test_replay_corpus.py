"""Temporal's replayer over recorded journals: a change to fold or decide that would act differently on a run
the real stack recorded fails here, naming the run, the position and both decisions.

The corpus (tests/corpus/*.jsonl) is recorded from real runs of the whole stack by `just record-corpus`
(tests/corpus/record.py); each file is a `crashsafe export`: a header with the pinned configuration and the
registry, then the journal byte for byte. A change that is meant to act differently re-records the corpus in the
same commit, so the diff of the journals shows what changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    JournalEvent,
    PolicyDenied,
    RunCompleted,
    RunHandedOff,
    RunResumed,
    ToolRejected,
    decode_event,
)
from crashsafe.contracts.tool_messages import Via
from crashsafe.domain import registry as registries
from crashsafe.domain.agent import Agent, Compensation
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import Registry
from crashsafe.domain.run_state import RunState
from crashsafe.export_file import Export, read_export
from crashsafe.replay_check import divergences, recorded_views
from crashsafe.run_views import decision_of
from tests.corpus.record import DELIVERED, RECEIVED_AS, VIEWS
from tests.support.journals import decision_steps
from tests.support.paths import GOLDEN, ROOT

CORPUS = ROOT / "tests" / "corpus"
JOURNALS = sorted(CORPUS.glob("*.jsonl"))
REGISTRIES: dict[str, Registry] = {}


def _registry(spec: str) -> Registry:
    if spec not in REGISTRIES:
        REGISTRIES[spec] = registries.load(spec or "crashsafe.services.agents:stayhub")
    return REGISTRIES[spec]


def _load(path: Path) -> tuple[Export, list[JournalEvent]]:
    export = read_export(path.read_bytes())
    return export, [decode_event(raw) for raw in export.events]


def _check(export: Export, journal: list[JournalEvent]) -> list[str]:
    registry = _registry(export.header.registry if export.header else "")
    config = export.header.config if export.header else None
    agent = registry.agent(journal[0].agent)  # type: ignore[union-attr]
    return [str(d) for d in divergences(journal, agent, config)]


@pytest.mark.parametrize("path", JOURNALS, ids=[p.stem for p in JOURNALS])
def test_a_recorded_run_decides_the_same_again(path: Path) -> None:
    export, journal = _load(path)
    found = _check(export, journal)
    assert not found, f"{path.name}: this code would not have written this journal:\n" + "\n".join(found)


@pytest.mark.parametrize("path", JOURNALS, ids=[p.stem for p in JOURNALS])
def test_a_recorded_run_shows_the_model_and_the_caller_what_it_showed_them(path: Path) -> None:
    """The journal does not hold the model's input, so the check above compares each ask with the transcript this
    code folds, i.e. with itself: a fold that drops a refusal from the model's view, doubles a guest's turn or
    shows it a compensation's output would pass it; nor does any decision read the run's summary (the reply a
    hand-off tells the guest, the tokens used). The views kept beside the corpus by the recorder
    (tests/corpus/views.json) hold the fold to what the recorded runs showed."""
    kept: dict[str, dict[str, Any]] = json.loads((CORPUS / VIEWS).read_text())
    assert path.stem in kept, f"{path.name} has no recorded views: re-record it (`just record-corpus`)"
    then, now = kept[path.stem], recorded_views(_load(path)[1])
    asks = sorted(
        set(then["asks"]) ^ set(now["asks"])
        | {p for p in now["asks"] if then["asks"].get(p) != now["asks"][p]},
        key=int,
    )
    assert not asks, (
        f"{path.name}: this code shows the model something else at the answers in positions {asks}"
    )
    assert now["summary"] == then["summary"], (
        f"{path.name}: the run's summary is not what the recorded run's was"
    )


def test_the_corpus_holds_what_its_names_promise() -> None:
    """The scenarios the recorder plays really happened in the journals (a recording that silently went the happy
    way would test nothing): a resume, a lookup, an undo, approvals both ways, a denial, hand-offs, a refund."""
    journals = {p.stem: _load(p)[1] for p in JOURNALS}

    def has(stem: str, kind: type, **fields: object) -> bool:
        return any(
            isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items()) for e in journals[stem]
        )

    assert has("booking_happy", RunCompleted) and not has("booking_happy", ToolRejected)
    assert has("booking_declined_released", ActionRequested, tool="release_booking")
    assert has("booking_unknown_resolved_by_lookup", ActionCompleted, via=Via.PROVIDER_LOOKUP.value)
    assert has("booking_runtime_killed_resumed", RunResumed)
    assert has("booking_runtime_killed_resumed", RunCompleted)
    assert has("approval_guest_approves", ApprovalRequested) and has(
        "approval_guest_approves", ApprovalDecided, decision="approved"
    )
    assert has("approval_after_restart_of_everything", ApprovalDecided, decision="approved")
    assert has("approval_manager_rejects_released", ApprovalDecided, decision="rejected")
    assert has("approval_manager_rejects_released", ActionRequested, tool="release_booking")
    assert has("policy_denied_past_checkin", PolicyDenied)
    assert has("tool_rejected_not_the_agents", ToolRejected)
    assert has("handoff_loop", RunHandedOff, reason="loop")
    assert has("handoff_budget_steps", RunHandedOff, reason="budget_steps")
    support = [s for s in journals if s.startswith("support_refund_approved")]
    assert any(has(s, ActionRequested, tool="refund_payment") for s in support)


def test_the_replayer_names_the_run_position_and_both_decisions_of_a_forged_journal() -> None:
    """A journal the code would not have written (the charge's amount changed after the fact) is caught where it
    differs, with what was journaled and what this code decides instead."""
    export, journal = _load(CORPUS / "booking_happy.jsonl")
    at = next(
        i for i, e in enumerate(journal) if isinstance(e, ActionRequested) and e.tool == "create_payment"
    )
    paid = journal[at]
    assert isinstance(paid, ActionRequested)
    forged = msgspec.structs.replace(paid, args={**paid.args, "amount_cents": 1})
    found = _check(export, [*journal[:at], forged, *journal[at + 1 :]])
    assert found, "a forged charge went unnoticed"
    assert found[0].startswith(f"run {paid.run_id} position {at + 1}: journaled 'run.action_requested")
    assert "(differs in args: " in found[0]
    assert '"amount_cents": 1,' in found[0] and f'"amount_cents": {paid.args["amount_cents"]},' in found[0]


def test_a_receipt_for_a_step_never_requested_is_a_divergence() -> None:
    export, journal = _load(CORPUS / "booking_happy.jsonl")
    done = next(e for e in journal if isinstance(e, ActionCompleted))
    stray = msgspec.structs.replace(done, step_no=99)
    found = _check(export, [*journal, stray])
    assert found == [
        f"run {done.run_id} position {len(journal) + 1}: journaled {decision_of(stray)!r}, "
        "but this code decides 'no such step was ever requested'"
    ]


def test_a_journal_from_before_projections_diverges_only_where_email_and_crm_left_the_models_tools() -> None:
    """Recorded (issue 5) from a stack whose runtime was SIGKILLed after journaling an action request, when the
    confirmation email and the CRM record were model steps. Under this code the model's asks for them are
    refused as unknown tools (they are projections now, planned from the ended run): exactly those two
    decisions differ, and nothing else does. A run in flight across the deploy that had already journaled
    those steps keeps them (the notify executor still serves them, under the same keys as the projections)."""
    export = read_export((GOLDEN / "journal_booking_runtime_killed.jsonl").read_bytes())
    journal = [decode_event(raw) for raw in export.events]
    assert export.header is None and any(isinstance(e, RunResumed) for e in journal)
    found = divergences(journal, _registry("").agent("booking"), None)
    # Since then (commit 7f6a5f5), a resumed run journals each ask before the model call: the five answers after the
    # resume were called without one; the replayer names them apart from the decisions.
    asks = [d for d in found if d.decided == "journal an ask first"]
    assert [(d.position, d.journaled.split(" ")[0]) for d in asks] == [
        (n, "run.model_answered") for n in (6, 9, 12, 15, 18)
    ]
    decisions = [d for d in found if d not in asks]
    assert [(d.position, d.journaled.split(" key=")[0]) for d in decisions] == [
        (13, "run.action_requested send_confirmation_email"),
        (16, "run.action_requested update_crm"),
    ]
    assert all("unknown_tool" in d.decided for d in decisions)
    # Its fold still works, for a run in flight across the deploy is such a journal: its already journaled email
    # and CRM steps are served by executor-notify under the projections' own keys (never twice).
    state = replay(journal)
    assert state is not None and state.status == "completed" and state.resumes == 1
    assert decision_steps(journal) == list(range(1, state.next_step))
    assert [req.tool for req, _ in state.completed] == [
        "search_hotels",
        "create_booking",
        "create_payment",
        "send_confirmation_email",
        "update_crm",
    ]


def test_a_run_pinned_to_a_published_catalog_replays_only_under_that_revisions_configuration() -> None:
    """The export carries the pinned revision's configuration because the decisions depend on it: the approval's
    expiry (the published catalog's 4 s ttl) is not what the built-in configuration would have asked for."""
    export, journal = _load(CORPUS / "approval_expired_released.jsonl")
    assert (
        export.header is not None and export.header.catalog_revision > 0 and export.header.config is not None
    )
    assert any(isinstance(e, ApprovalDecided) and e.decision == "expired" for e in journal)
    assert _check(export, journal) == []
    built_in = divergences(journal, _registry(export.header.registry).agent("booking"), None)
    asked = next(i for i, e in enumerate(journal) if isinstance(e, ApprovalRequested))
    assert built_in and built_in[0].position == asked + 1
    assert built_in[0].journaled.startswith("run.approval_requested")
    assert "(differs in expires_at: " in built_in[0].decided


def test_re_planning_a_recorded_run_gives_the_keys_its_receivers_already_hold() -> None:
    """The projector's tasks are derived, so any replica (or the reconciler) may plan an ended run again, today or
    after a deploy: the receivers deduplicate by key, so a planner that now derived another key from the same
    journal would send the guest a second email. The keys are the ones the real receivers held after the
    recording (tests/corpus/delivered.json), not ones this code computed."""
    delivered: dict[str, dict[str, list[str]]] = json.loads((CORPUS / DELIVERED).read_text())
    assert delivered, "the corpus holds no delivered projections: re-record it"
    for path in JOURNALS:
        export, journal = _load(path)
        registry = _registry(export.header.registry if export.header else "")
        state = replay(journal)
        assert state is not None
        tasks = plan(state, len(journal), registry.agent(state.agent), registry.projections, state.started.at)
        planned = {
            tool: sorted(t.key for t in tasks if t.tool == tool)
            for tool in RECEIVED_AS
            if any(t.tool == tool for t in tasks)
        }
        assert planned == delivered.get(path.stem, {}), path.name


class _UndoesEndedRuns:
    """The booking agent with a new rule, as a deploy might bring: a run that was handed off gets its first
    search "undone". Before the end it is the agent itself."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def __getattr__(self, name: str) -> object:
        return getattr(self._agent, name)

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        if not state.terminal:
            return self._agent.compensations(state, ending)
        first = state.completed[0][0]
        return (Compensation("release_booking", {"booking_id": "bk_x"}, first.key, CompensationKind.RELEASE),)


def test_code_that_would_act_on_a_run_after_its_end_is_a_divergence() -> None:
    """An ended run stays ended: code that would act on it after a deploy (undo something of a run that was
    handed off) fails at the position after the journal's last event, and nowhere else."""
    export, journal = _load(CORPUS / "handoff_budget_steps.jsonl")
    assert export.header is not None
    agent = _UndoesEndedRuns(_registry(export.header.registry).agent("booking"))
    found = divergences(journal, agent, export.header.config)  # type: ignore[arg-type]
    assert [(d.position, d.journaled) for d in found] == [(len(journal) + 1, "nothing (the run ended)")]
    assert found[0].decided.startswith("journal run.action_requested release_booking")
