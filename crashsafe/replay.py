"""`crashsafe replay` and `crashsafe export`: a run rebuilt from its journal with the runtime's own fold and decide.

The pure half (everything above "The shell") reads journals as bytes and returns text: no NATS, no clock, no
files. It is what the CLI prints and what the recorded-journal corpus test (tests/unit/test_replay_corpus.py)
checks (`replay_check`), so the operator's replay and CI's replay are one code path. The export file's format is
`export_file`'s.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.projections import ProjectionTask
from crashsafe.contracts.run_events import JournalEvent, RunStarted, decode_event
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.domain.decide import next_move
from crashsafe.domain.fold import fold_run, summarize
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import Registry
from crashsafe.domain.run_state import RunState
from crashsafe.export_file import (
    BadExport,
    Export,
    decode_journal,
    event_type,
    export_lines,
    read_export,
)
from crashsafe.run_views import diff_views, move_summary, state_view, summary_of
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.run_evidence import pinned_header
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_journal import RunJournal

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


# The shell: the journal and the pinned configuration from a deployment, or from an export file -----------------


async def read_run(settings: Settings, registry: Registry, run_id: str) -> Export | None:
    """The run's export as a deployment holds it (None: no such run): raw events, the pinned configuration."""
    async with operator_broker(settings, "crashsafe-replay") as broker:
        ns = settings.namespace
        stored = await RunJournal(broker, ns).stored(run_id)
        if not stored:
            return None
        raw = tuple(m.data for m in stored)
        try:
            first: JournalEvent | None = decode_event(raw[0])
        except (msgspec.DecodeError, msgspec.ValidationError):
            first = None  # exported as it is, corrupt or not; the replay names the position
        header = await pinned_header(broker, ns, registry, settings.registry, run_id, first)
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
