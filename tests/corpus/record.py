"""Records the replay corpus (tests/corpus/*.jsonl) from real runs of the real stack: `just record-corpus`.

Each scenario is played through the gateway of the product's own stack (embedded nats-server, sandbox, every
service as a process, the scripted model), the way the eval suite plays its conversations; faults are armed on the
sandbox providers and services are SIGKILLed where a scenario says so. Every run a scenario started is then
exported exactly as `crashsafe export` writes it (a header with the pinned configuration, then each journaled
event byte for byte) to `<scenario>.jsonl`, or `<scenario>-<n>.jsonl` for a scenario of several runs.

Re-record after a change to the booking flow, the scripted model or the policy defaults (the corpus test then
checks the new code against the new journals, and keeps checking it against them from then on):

    .venv/bin/python -m tests.corpus.record            # every scenario, rewrites tests/corpus/
    .venv/bin/python -m tests.corpus.record --only declined
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import Registry
from crashsafe.evals.conversation import Say, Scenario, ScenarioClass
from crashsafe.evals.runner import SETTLE_S, Conversation, EvalStack, ModelChoice, play, running_stack
from crashsafe.evals.scenarios import SCENARIOS, TWO_NIGHTS
from crashsafe.export_file import Export, decode_journal, export_lines
from crashsafe.replay import read_run
from crashsafe.replay_check import recorded_views
from crashsafe.sandbox.listing import SandboxListing

CORPUS = Path(__file__).resolve().parent
# What the receivers hold for each recorded run's projections: {journal: {tool: [keys]}}.
DELIVERED = "delivered.json"
# What each recorded run showed outside its journal: {journal: {"asks": {position: digest of the model's input},
# "summary": the run's summary}} (crashsafe.replay.recorded_views, computed here by the code that ran it).
VIEWS = "views.json"
# The sandbox ledger's effect kind of each projection tool whose receiver keeps its keys.
RECEIVED_AS = {"send_confirmation_email": "email", "update_crm": "crm_update"}


def _eval(name: str) -> Scenario:
    (found,) = [s for s in SCENARIOS if s.name == name]
    return found


def _booking(name: str) -> Scenario:
    return Scenario(name, ScenarioClass.BOOKS, (Say(TWO_NIGHTS),), ())


async def _played(evals: EvalStack, scenario: Scenario) -> list[str]:
    result = await play(evals, scenario)
    if result.problems:
        # Recorded anyway: the journal is what the code did, and the corpus test checks exactly that.
        print(f"  note: {scenario.name}: {'; '.join(result.problems)}", file=sys.stderr)
    return result.runs


async def _with_fault(evals: EvalStack, fault: dict[str, Any], scenario: Scenario) -> list[str]:
    armed = await evals.sandbox.put("/_faults", json=fault)
    armed.raise_for_status()
    try:
        return await _played(evals, scenario)
    finally:
        (await evals.sandbox.delete("/_faults")).raise_for_status()


async def _runtime_killed_mid_payment(evals: EvalStack) -> list[str]:
    """The runtime SIGKILLed while the payment is in flight: another runtime resumes the run from its journal."""
    (await evals.sandbox.put("/_faults", json={"target": "payments", "latency_ms": 3000})).raise_for_status()
    try:
        conversation = Conversation(evals, f"corpus-crash-{uuid.uuid4().hex[:6]}")
        await conversation.say(Say(TWO_NIGHTS))
        (run_id,) = conversation.runs
        deadline = time.monotonic() + SETTLE_S
        while not await _requested(evals, run_id, "create_payment"):
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} never asked for its payment")
            await asyncio.sleep(0.1)
        evals.stack.restart("runtime")  # SIGKILL, then a fresh process (blocking, like the eval's RestartAll)
        await conversation.settle(SETTLE_S)
        return conversation.runs
    finally:
        (await evals.sandbox.delete("/_faults")).raise_for_status()


async def _requested(evals: EvalStack, run_id: str, tool: str) -> bool:
    response = await evals.gateway.get(f"/v1/runs/{run_id}/events")
    return response.status_code == 200 and any(
        e["type"] == "run.action_requested" and e.get("tool") == tool for e in response.json()["events"]
    )


@dataclass(frozen=True)
class Recording:
    name: str
    play: Callable[[EvalStack], Awaitable[list[str]]]


RECORDINGS = (
    Recording("booking_happy", lambda e: _played(e, _eval("books and confirms to the verified address"))),
    Recording(
        "booking_declined_released",
        lambda e: _with_fault(e, {"target": "payments", "decline": 1}, _booking("declined")),
    ),
    Recording(
        "booking_unknown_resolved_by_lookup",
        lambda e: _with_fault(e, {"target": "payments", "drop_after_commit": 1}, _booking("unknown")),
    ),
    Recording("booking_runtime_killed_resumed", _runtime_killed_mid_payment),
    Recording("approval_guest_approves", lambda e: _played(e, _eval("guest approves a stay over the limit"))),
    Recording(
        "approval_after_restart_of_everything",
        lambda e: _played(e, _eval("guest approves after every service restarted while the run waited")),
    ),
    Recording(
        "approval_manager_rejects_released",
        lambda e: _played(e, _eval("manager rejects a corporate booking and the hold is released")),
    ),
    Recording(
        # The scenario publishes a catalog with a short approval ttl: the run pins a revision other than 0, so
        # its export carries that revision's configuration.
        "approval_expired_released",
        lambda e: _played(e, _eval("approval expires and the hold is released")),
    ),
    Recording("policy_denied_past_checkin", lambda e: _played(e, _eval("refuses a check-in in the past"))),
    Recording(
        "tool_rejected_not_the_agents",
        lambda e: _played(e, _eval("refuses a tool the agent does not have")),
    ),
    Recording("handoff_loop", lambda e: _played(e, _eval("a model repeating one call is stopped as a loop"))),
    Recording(
        "handoff_budget_steps",
        lambda e: _played(e, _eval("a model that never stops runs out of steps")),
    ),
    Recording(
        "support_refund_approved", lambda e: _played(e, _eval("manager approves a refund over 150 EUR"))
    ),
)


async def record(only: str | None, out: Path) -> int:
    chosen = [r for r in RECORDINGS if only is None or only in r.name]
    if not chosen:
        print(f"no recording matches {only!r}: {', '.join(r.name for r in RECORDINGS)}", file=sys.stderr)
        return 2
    path = out / DELIVERED
    delivered: dict[str, dict[str, list[str]]] = json.loads(path.read_text()) if path.exists() else {}
    views_path = out / VIEWS
    views: dict[str, dict[str, Any]] = json.loads(views_path.read_text()) if views_path.exists() else {}
    async with running_stack(ModelChoice.SCRIPTED) as evals:
        settings = settings_for(evals.stack.state_dir)
        registry = registries.load(settings.registry)
        for recording in chosen:
            print(f"recording {recording.name}", file=sys.stderr)
            runs = await recording.play(evals)
            for old in out.glob(f"{recording.name}*.jsonl"):
                if old.stem == recording.name or old.stem.rpartition("-")[0] == recording.name:
                    old.unlink()
            for n, run_id in enumerate(runs, start=1):
                export = await read_run(settings, registry, run_id)
                assert export is not None and export.header is not None, f"run {run_id} has no journal"
                suffix = f"-{n}" if len(runs) > 1 else ""
                path = out / f"{recording.name}{suffix}.jsonl"
                path.write_bytes(export_lines(export.header, export.events))
                views[path.stem] = recorded_views(decode_journal(export.events))
                print(f"  {path.name}: run {run_id}, {len(export.events)} events", file=sys.stderr)
                keys = await _delivered(evals, registry, export)
                delivered.pop(path.stem, None)
                if keys:
                    delivered[path.stem] = keys
    (out / DELIVERED).write_text(json.dumps(delivered, indent=2, sort_keys=True) + "\n")
    kept = {p.stem for p in out.glob("*.jsonl")}
    views = {stem: v for stem, v in views.items() if stem in kept}
    views_path.write_text(json.dumps(views, indent=2, sort_keys=True) + "\n")
    return 0


async def _delivered(evals: EvalStack, registry: Registry, export: Export) -> dict[str, list[str]]:
    """The keys the receivers hold for the run's projections, once the projector delivered them: the evidence
    the corpus test holds the planner to (re-planning an old run must give these keys, or a guest gets a second
    email). The wait is for the projector to finish, not a timing assertion."""
    journal = decode_journal(export.events)
    state = replay(journal)
    assert state is not None
    tasks = [
        t
        for t in plan(
            state, len(journal), registry.agent(state.agent), registry.projections, state.started.at
        )
    ]
    wanted = {t.tool for t in tasks if t.tool in RECEIVED_AS}
    if not wanted:
        return {}
    listing = SandboxListing(evals.sandbox)
    deadline = time.monotonic() + SETTLE_S
    while True:
        entries = (await listing.view(state.guest_id)).entries
        held = {
            tool: sorted(e.key for e in entries if e.kind.value == kind)
            for tool, kind in RECEIVED_AS.items()
            if tool in wanted
        }
        if all(held.values()) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus.record", description=__doc__)
    parser.add_argument("--only", default=None, help="only recordings whose name contains this")
    parser.add_argument("--out", default=str(CORPUS), help="where the journals go (default tests/corpus/)")
    args = parser.parse_args(argv)
    sys.exit(asyncio.run(record(args.only, Path(args.out))))


if __name__ == "__main__":
    main()
