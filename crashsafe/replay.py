"""`crashsafe replay` and `crashsafe export`: a run rebuilt from its journal with the runtime's own fold and decide.

The pure half (everything above "The shell") reads journals as bytes and returns text: no NATS, no clock, no
files. It is what the CLI prints and what the recorded-journal corpus test (tests/unit/test_replay_corpus.py)
checks, so the operator's replay and CI's replay are one code path.

Export format (JSON Lines; why, in docs/decisions.md): a first header line
`{"type": "crashsafe.export", "format": 1, "run_id", "catalog_revision", "config", "registry"}` carrying the
agent's configuration at the run's pinned catalog revision (what `next_move` needs, and what an offline machine
cannot read from the catalog bucket) and the registry that ran it, then every journaled event, one per line,
byte for byte as the RUNS stream holds it. A file without the header (a plain journal) replays too, under the
agent's built-in configuration.
"""

from __future__ import annotations

import hashlib
import json
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import CatalogRevisionGone
from crashsafe.contracts.projections import ProjectionTask
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    HandOffReason,
    JournalEvent,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    PolicyDenied,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    TurnReceived,
    UnknownEvent,
    decode_event,
)
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain import registry as registries
from crashsafe.domain.agent import Agent
from crashsafe.domain.decide import (
    Append,
    AskModel,
    AwaitActions,
    AwaitApproval,
    DecideApproval,
    Idle,
    Move,
    next_move,
)
from crashsafe.domain.fold import fold_run, summarize
from crashsafe.domain.model_calls import ModelReply, ask_at_risk, model_answered
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import Registry
from crashsafe.domain.run_state import RunState
from crashsafe.operations import settings_for
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.runtime.catalog import RunCatalog
from crashsafe.timeline import describe

EXPORT_TYPE = "crashsafe.export"
EXPORT_FORMAT = 1


class ExportHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The first line of an export: what replaying the run needs besides its events."""

    type: str = EXPORT_TYPE
    format: int = EXPORT_FORMAT
    run_id: str
    catalog_revision: int = 0
    config: AgentConfig | None = None  # None: the agent's built-in configuration
    registry: str = ""  # the deployment's CRASHSAFE_REGISTRY (which agents' code decided), "" if not known


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


# What a state is, for a person ---------------------------------------------------------------------------------


def state_view(state: RunState) -> dict[str, Any]:
    """The state's fields a person debugs with, as plain JSON values (the diff compares these)."""
    summary = msgspec.to_builtins(summarize(state))
    return {
        **summary,
        "next_step": state.next_step,
        "events": state.events,
        "resumes": state.resumes,
        "model_steps": state.model_steps,
        "action_steps": state.action_steps,
        "unplanned": [f"{c.name}({c.arguments})" for c in state.unplanned],
        "completed": [f"{req.tool} {req.key}: {done.status}" for req, done in state.completed],
        "awaiting": state.awaiting.approval_id if state.awaiting else None,
        "approvals": [f"{a.approval_id}: {a.decision} by {a.decided_by}" for a in state.approvals],
        "inbox": [t.event_id for t in state.inbox],
        "turns": state.turns,
        "denials": state.denials,
        "tool_errors": state.tool_errors,
        "lost_asks": state.lost_asks,
        "unknown_events": list(state.unknown_events),
        "final_reply": state.final_reply,
    }


def diff_views(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed, field by field: `field: old -> new`, list fields as `+ item` / `- item`."""
    out: list[str] = []
    for name, new in after.items():
        old = before.get(name) if before is not None else None
        if old == new:
            continue
        if isinstance(new, list) and isinstance(old, list | None):
            old_items = old or []
            out += [f"{name}: - {item}" for item in old_items if item not in new]
            out += [f"{name}: + {item}" for item in new if item not in old_items]
        else:
            out.append(f"{name}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def summary_of(event: JournalEvent) -> str:
    """One line for one event."""
    match event:
        case UnknownEvent():
            return f"not understood by this version (kept, skipped by the fold): {event.type}"
        case PolicyDenied():
            return f"denied {event.tool} by {event.rule}: {event.reason}"
        case ApprovalRequested():
            return f"approval {event.approval_id} of {event.tool} asked of {event.approver} ({event.rule})"
        case ApprovalDecided():
            return f"approval {event.approval_id} {event.decision} by {event.decided_by}"
        case TurnReceived():
            return f"guest turn {event.event_id}"
        case ModelAsked():
            return f"model asked for step {event.step_no}" + (
                f", failed: {event.failed}" if event.failed else ""
            )
        case ModelRejected():
            return f"model answer refused: {event.error.code}"
        case RunNudged():
            return "nudged"
    _, what, detail = describe(event)
    return f"{what}: {detail}" if detail else what


def move_summary(move: Move) -> str:
    """What the runtime would do, in one line (the corpus test names both sides of a divergence with these)."""
    match move:
        case AskModel(step_no=step_no):
            return f"ask the model for step {step_no}"
        case Append(events=events):
            return "journal " + "; ".join(decision_of(e) for e in events)
        case AwaitActions(pending=pending):
            return "wait for " + ", ".join(f"{p.tool} {p.key}" for p in pending)
        case AwaitApproval(approval=approval):
            return f"wait for approval {approval.approval_id}"
        case DecideApproval(approval=approval, decision=decision, decided_by=by):
            return f"decide approval {approval.approval_id}: {decision} by {by}"
        case Idle():
            return "nothing (idle)"
    return repr(move)


def decision_of(event: JournalEvent) -> str:
    """An event as a decision, whole: its type, and for an action its tool, key and every argument (a summary
    cuts long arguments; a divergence must show the one that differs)."""
    if isinstance(event, ActionRequested):
        args = json.dumps(event.args, sort_keys=True, default=str)
        return f"{event_type(event)} {event.tool} key={event.key} args={args} origin={event.origin}"
    return f"{event_type(event)} {summary_of(event)}"


def event_type(event: JournalEvent) -> str:
    if isinstance(event, UnknownEvent):
        return event.type
    return str(type(event).__struct_config__.tag)


# Replay ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transition:
    position: int  # 1-based, as in `event_id(run_id, position)`
    type: str
    summary: str
    status: str
    changes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Replayed:
    run_id: str
    transitions: tuple[Transition, ...]
    state: RunState | None
    next: str  # what the runtime would do next, at the time of the last event replayed
    catalog_revision: int = 0
    config: str = "built-in"
    projections: tuple[ProjectionTask, ...] = ()


def replay_events(
    events: Sequence[JournalEvent], registry: Registry, config: AgentConfig | None, until: int | None = None
) -> Replayed:
    """Fold `events` (up to position `until`) with the runtime's fold, then ask the runtime's `next_move` (and, for
    an ended run, the projector's `plan`) what comes next, at the time of the last event replayed."""
    cut = list(events if until is None else events[:until])
    state: RunState | None = None
    view: dict[str, Any] | None = None
    transitions: list[Transition] = []
    for position, event in enumerate(cut, start=1):
        state = fold_run(state, event)
        after = state_view(state)
        transitions.append(
            Transition(
                position,
                event_type(event),
                summary_of(event),
                str(state.status),
                tuple(diff_views(view, after)),
            )
        )
        view = after
    if state is None:
        return Replayed(run_id="", transitions=(), state=None, next="nothing: the journal is empty")
    agent = registry.agent(state.agent)
    now = cut[-1].at
    first = cut[0]
    revision = first.catalog_revision if isinstance(first, RunStarted) else 0
    return Replayed(
        run_id=state.run_id,
        transitions=tuple(transitions),
        state=state,
        next=move_summary(next_move(state, agent, now, config)),
        catalog_revision=revision,
        config="pinned" if config is not None else "built-in",
        # What the projector plans from an ended run (derived, so this is exactly what it publishes).
        projections=tuple(plan(state, len(cut), agent, registry.projections, now)) if state.terminal else (),
    )


def printable(text: str) -> str:
    """`text` with every control or format character escaped (a newline, an ANSI escape, a bidi override): what a
    guest or a model wrote can neither forge a line of the replay nor drive the operator's terminal."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch)[0] == "C" else ch
        for ch in text
    )


def render(replayed: Replayed, show_diff: bool) -> str:
    """The human form of `crashsafe replay` (one line per transition and per change, whatever the events hold)."""
    lines = [
        f"run {replayed.run_id} (catalog revision {replayed.catalog_revision}, {replayed.config} config)"
    ]
    for t in replayed.transitions:
        lines.append(f"{t.position:>4}  {t.type:<24} {t.summary}  [{t.status}]")
        if show_diff:
            lines += [f"        {change}" for change in t.changes]
    if replayed.state is not None:
        s = summarize(replayed.state)
        lines.append(f"status {s.status}, {s.steps} steps, {s.tokens_used} tokens")
    lines.append(f"next: {replayed.next}")
    lines += [f"projection: {p.tool} key={p.key}{_task_detail(p)}" for p in replayed.projections]
    return "\n".join(printable(line) for line in lines) + "\n"


def _task_detail(task: ProjectionTask) -> str:
    if task.upto:
        return f" events 1..{task.upto}"
    return f" args={json.dumps(task.args, sort_keys=True, default=str)}"


def render_json(replayed: Replayed, show_diff: bool) -> str:
    """The machine form: one JSON document (transitions, the final state's view, the next move)."""
    body = {
        "run_id": replayed.run_id,
        "catalog_revision": replayed.catalog_revision,
        "transitions": [
            {
                "position": t.position,
                "type": t.type,
                "summary": t.summary,
                "status": t.status,
                **({"changes": list(t.changes)} if show_diff else {}),
            }
            for t in replayed.transitions
        ],
        "state": state_view(replayed.state) if replayed.state is not None else None,
        "next": replayed.next,
        "projections": [
            {"tool": p.tool, "key": p.key, "args": p.args, "upto": p.upto} for p in replayed.projections
        ],
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


# The corpus check: would this code have written this journal? ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Divergence:
    run_id: str
    position: int
    journaled: str
    decided: str

    def __str__(self) -> str:
        return (
            f"run {self.run_id} position {self.position}: journaled {self.journaled!r}, "
            f"but this code decides {self.decided!r}"
        )


def fields_differing(journaled: RunEvent, decided: RunEvent) -> str:
    """`field: journaled -> decided` for each field two events of one type disagree on."""
    a, b = msgspec.to_builtins(journaled), msgspec.to_builtins(decided)
    return "; ".join(
        f"{k}: {json.dumps(a.get(k), default=str)} -> {json.dumps(b.get(k), default=str)}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    )


def _reply_from(event: ModelAnswered) -> ModelReply:
    return ModelReply(
        model=event.model,
        response_id=event.response_id,
        tool_calls=tuple(event.tool_calls),
        reply=event.reply,
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        provider=event.provider,
        failovers=tuple(event.failovers),
    )


# Hand-offs the runtime's shell decides from what it found outside the journal (the policy documents missing, the
# pinned catalog revision gone), not `next_move`: a replay takes them as given, as it takes a failed model call.
SHELL_HANDOFFS = frozenset(
    {HandOffReason.POLICY_UNAVAILABLE.value, HandOffReason.CATALOG_REVISION_GONE.value}
)


def _inputs(event: JournalEvent) -> bool:
    """Events the outside world journals (receipts are checked apart): markers, turns, decided approvals, a failed
    model call, a hand-off the shell decided, and events of a newer writer."""
    return (
        isinstance(event, RunResumed | RunNudged | TurnReceived | ApprovalDecided | UnknownEvent)
        or (isinstance(event, ModelAsked) and bool(event.failed))
        or (isinstance(event, RunHandedOff) and event.reason in SHELL_HANDOFFS)
    )


def divergences(
    journal: Sequence[JournalEvent], agent: Agent, config: AgentConfig | None
) -> list[Divergence]:
    """Temporal's replayer: fold each prefix, decide with the clock at the next event, compare with the journal.

    A decision that journals several events at one `now` (the calls of one answer, compensations) is compared as
    one batch. A model answer must have been asked for at its step, with the transcript the model saw, and be
    journaled as `model_answered` builds it; a receipt must answer a pending step (or repeat a settled one)."""
    found: list[Divergence] = []
    batch: list[RunEvent] = []
    run_id = journal[0].run_id if journal else ""
    state: RunState | None = fold_run(None, journal[0]) if journal else None
    states: list[RunState | None] = [None, state]  # states[i]: the fold of journal[:i]
    for i in range(1, len(journal)):
        event = journal[i]
        assert state is not None
        before = state
        state = fold_run(state, event)
        states.append(state)
        position = i + 1
        if batch and event == batch[0]:
            batch.pop(0)
            continue
        # A batch cut short (a crash between its appends, then a resume) is decided again from here: the next
        # event is checked against a fresh decision, never against the rest of the old batch.
        batch = []
        if _inputs(event):
            continue
        if isinstance(event, ModelAnswered | ModelRejected) and isinstance(journal[i - 1], ModelAsked):
            prior = states[i - 1]  # the decision to ask was taken before the ask was journaled
            assert prior is not None
            before = prior
        move = next_move(before, agent, event.at, config)
        if isinstance(event, ModelAsked | ModelRejected | ModelAnswered):
            step = event.step_no
            # The ask is journaled before the call exactly when the run is at risk (resumed, or an ask lost):
            # a change of that rule would journal asks the recorded runs did not, or lose the ones they did.
            asked_first = not isinstance(event, ModelAsked) and isinstance(journal[i - 1], ModelAsked)
            if isinstance(event, ModelAsked) != ask_at_risk(before) and not asked_first:
                said = (
                    "journal an ask first"
                    if ask_at_risk(before)
                    else "call the model without journaling an ask"
                )
                found.append(Divergence(run_id, position, decision_of(event), said))
            elif move != AskModel(step_no=step, input=before.transcript):
                found.append(Divergence(run_id, position, decision_of(event), move_summary(move)))
            elif isinstance(event, ModelAnswered):
                rebuilt = model_answered(before, _reply_from(event), event.at, tuple(event.passages))
                if rebuilt != event:
                    found.append(Divergence(run_id, position, decision_of(event), decision_of(rebuilt)))
            continue
        if isinstance(event, ActionCompleted):
            if before.pending_step(event.step_no) is None:
                if not before.is_completed(event.step_no):
                    found.append(
                        Divergence(run_id, position, decision_of(event), "no such step was ever requested")
                    )
            elif not (isinstance(move, AwaitActions) and event.step_no in {p.step_no for p in move.pending}):
                found.append(Divergence(run_id, position, decision_of(event), move_summary(move)))
            continue
        if not isinstance(move, Append) or move.events[0] != event:
            decided = move_summary(move)
            if isinstance(move, Append) and type(move.events[0]) is type(event):
                decided += f" (differs in {fields_differing(event, move.events[0])})"
            found.append(Divergence(run_id, position, decision_of(event), decided))
            continue
        batch = list(move.events[1:])
    # A journal may end inside a batch (a crash between two appends): the runtime decides the rest again.
    if not batch and state is not None and state.terminal:
        # An ended run must stay ended under this code: a deploy must not start acting on old runs (a new
        # compensation rule undoing what a finished run did, a request published again).
        after = next_move(state, agent, journal[-1].at, config)
        if not isinstance(after, Idle):
            found.append(Divergence(run_id, len(journal) + 1, "nothing (the run ended)", move_summary(after)))
    return found


def model_views(journal: Sequence[JournalEvent]) -> dict[str, str]:
    """What the model was shown at each answered step, by journal position of the answer: a digest of the
    transcript the runtime sent (`AskModel.input`, the fold of the journal before the ask).

    The journal does not hold the model's input, so `divergences` can only check an answer's ask against the
    transcript this code folds, which is itself: a fold that changed what the model sees (a refusal dropped, a
    guest's turn doubled, a compensation's output shown) would pass. The recorder keeps these digests beside
    the corpus (tests/corpus/views.json), computed by the code that ran, and the corpus test holds the
    fold to them."""
    views: dict[str, str] = {}
    state: RunState | None = None
    states: list[RunState | None] = [None]
    for event in journal:
        state = fold_run(state, event)
        states.append(state)
    for i, event in enumerate(journal):
        if not isinstance(event, ModelAnswered | ModelRejected):
            continue
        asked = i - 1 if i > 0 and isinstance(journal[i - 1], ModelAsked) else i
        before = states[asked]
        if before is not None:
            body = _view_encoder.encode(list(before.transcript))
            views[str(i + 1)] = hashlib.sha256(body).hexdigest()
    return views


_view_encoder = msgspec.json.Encoder(order="sorted")


def recorded_views(journal: Sequence[JournalEvent]) -> dict[str, Any]:
    """What a recorded run showed outside its journal: the model at each answered step (`model_views`), and the
    caller at the end (`GET /v1/runs/{id}`'s summary of the fold)."""
    state: RunState | None = None
    for event in journal:
        state = fold_run(state, event)
    summary = msgspec.to_builtins(summarize(state)) if state is not None else None
    return {"asks": model_views(journal), "summary": summary}


# The shell: the journal and the pinned configuration from a deployment, or from an export file -----------------


async def read_run(settings: Settings, registry: Registry, run_id: str) -> Export | None:
    """The run's export as a deployment holds it (None: no such run): raw events, the pinned configuration."""
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-replay", fail_fast=True, access=settings.nats_access
    )
    try:
        ns = settings.namespace
        stored = await broker.read_subject(ns.stream(StreamKind.RUNS), ns.run_events(run_id))
        if not stored:
            return None
        raw = tuple(m.data for m in stored)
        try:
            first: JournalEvent | None = decode_event(raw[0])
        except (msgspec.DecodeError, msgspec.ValidationError):
            first = None  # exported as it is, corrupt or not; the replay names the position
        revision = first.catalog_revision if isinstance(first, RunStarted) else 0
        config: AgentConfig | None = None
        if revision and isinstance(first, RunStarted):
            # The agent's configuration at the run's pinned revision, read as the runtime reads it.
            try:
                config = await RunCatalog(registry, broker, ns).pinned(revision, first.agent)
            except CatalogRevisionGone:
                config = (
                    None  # as the runtime does: it hands the run off and decides under the built-in config
                )
    finally:
        await broker.close()
    header = ExportHeader(run_id=run_id, catalog_revision=revision, config=config, registry=settings.registry)
    return Export(header, raw)


def replayed_text(
    export: Export, registry: Registry, until: int | None, show_diff: bool, as_json: bool
) -> str:
    events = decode_journal(export.events)
    config = export.header.config if export.header else None
    replayed = replay_events(events, registry, config, until)
    return render_json(replayed, show_diff) if as_json else render(replayed, show_diff)


def _registry(spec: str) -> Registry | None:
    try:
        return registries.load(spec)
    except (ImportError, ValueError) as exc:
        print(f"crashsafe: registry {spec!r} (CRASHSAFE_REGISTRY, or the export's): {exc}", file=sys.stderr)
        return None


async def replay_command(
    state_dir: Path,
    run_id: str | None,
    until: int | None,
    show_diff: bool,
    file: Path | None,
    as_json: bool,
) -> int:
    settings = settings_for(state_dir)
    if file is not None:
        try:
            export: Export | None = read_export(file.read_bytes())
        except (OSError, BadExport) as exc:
            print(printable(f"crashsafe: {file}: {exc}"), file=sys.stderr)
            return 1
        assert export is not None
        if run_id and export.events and decode_event(export.events[0]).run_id != run_id:
            print(f"crashsafe: {file} holds another run, not {run_id}", file=sys.stderr)
            return 1
        # The file says which registry's agents decided its run, but a file never chooses the code that runs
        # here (loading a registry imports a module and calls a function it names): this deployment's
        # CRASHSAFE_REGISTRY decides, and a different one in the header is said.
        named = export.header.registry if export.header else ""
        if named and named != settings.registry:
            print(
                printable(
                    f"crashsafe: {file} was exported under registry {named!r}; replaying under "
                    f"{settings.registry!r} (set CRASHSAFE_REGISTRY={named} to replay under that one)"
                ),
                file=sys.stderr,
            )
        registry = _registry(settings.registry)
        if registry is None:
            return 1
    else:
        if not run_id:
            print("crashsafe: replay needs RUN_ID (or --file F)", file=sys.stderr)
            return 2
        registry = _registry(settings.registry)
        if registry is None:
            return 1
        export = await read_run(settings, registry, run_id)
        if export is None:
            print(f"crashsafe: no run {run_id} in namespace {settings.namespace.name}", file=sys.stderr)
            return 1
    try:
        text = replayed_text(export, registry, until, show_diff, as_json)
    except BadExport as exc:
        print(printable(f"crashsafe: run {run_id or file}: {exc}"), file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


async def export_command(state_dir: Path, run_id: str, out: Path | None) -> int:
    settings = settings_for(state_dir)
    registry = _registry(settings.registry)
    if registry is None:
        return 1
    export = await read_run(settings, registry, run_id)
    if export is None:
        print(f"crashsafe: no run {run_id} in namespace {settings.namespace.name}", file=sys.stderr)
        return 1
    assert export.header is not None
    body = export_lines(export.header, export.events)
    if out is None:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    else:
        out.write_bytes(body)
        print(f"{len(export.events)} events of run {run_id} written to {out}", file=sys.stderr)
    return 0
