"""`run.action_completed` names its tool (issue 32, item 10), filled by the runtime from the request it completes:
an adopter matching receipts to tools no longer joins by key. A 0.2 receipt, without it, still decodes, folds and
replays as it did."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, decode_event
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus
from crashsafe.domain import intake
from crashsafe.domain.fold import replay
from crashsafe.sdk import AgentBase, AgentConfig
from crashsafe.testing import Unknown, ask, play, reply
from tests.support.misbehaving import NOOP
from tests.support.paths import GOLDEN
from tests.support.runs import assert_replays, booking_model, drive, started

pytestmark = pytest.mark.unit


class Echo(AgentBase):
    name = "echo"
    tools = {NOOP.name: NOOP.contract}
    config = AgentConfig(agent="echo")


def test_the_runtime_journals_each_receipt_with_the_tool_of_the_request_it_completes() -> None:
    played = play(
        Echo(),
        "go",
        model=[ask("noop", i=1), ask("noop", i=2), reply("done")],
        tools={"noop": {"done": True}},
    )
    receipts = played.of(ActionCompleted)
    assert len(receipts) == 2 and [r.tool for r in receipts] == ["noop", "noop"]


def test_a_late_resolution_of_an_unknown_names_the_tool_of_the_step_it_settles() -> None:
    played = play(Echo(), "go", model=[ask("noop", i=1), reply("done")], tools={"noop": Unknown()})
    (request,) = played.of(ActionRequested)
    (unknown,) = played.of(ActionCompleted)
    assert (unknown.status, unknown.tool) == (OutcomeStatus.UNKNOWN, "noop")
    settled = ActionOutcome(
        run_id=request.run_id,
        step_no=request.step_no,
        tool=request.tool,
        key=request.key,
        status=OutcomeStatus.SUCCEEDED,
        result={"done": True},
    )
    (late,) = intake.completed(played.state, settled, unknown.at + timedelta(seconds=5))
    assert (late.status, late.tool) == (OutcomeStatus.SUCCEEDED, "noop")


def test_a_02_receipt_without_its_tool_decodes_folds_and_replays_as_before() -> None:
    """Release 0.2 journals no `tool`: its receipts read as "" and the run folds and replays to the same
    decisions; the same journal with each receipt's tool filled in folds to the same run."""
    old = decode_event((GOLDEN / "v1" / "run.action_completed.json").read_bytes())
    assert isinstance(old, ActionCompleted) and old.tool == ""
    # Receipts built without a tool, as 0.2 journaled them.
    run = drive(started(), booking_model, lambda request: "succeeded")
    assert all(e.tool == "" for e in run.events if isinstance(e, ActionCompleted))
    assert_replays(run.events)
    tools = {e.step_no: e.tool for e in run.events if isinstance(e, ActionRequested)}
    named = [
        msgspec.structs.replace(e, tool=tools[e.step_no]) if isinstance(e, ActionCompleted) else e
        for e in run.events
    ]
    assert_replays(named)
    folded, folded_named = replay(run.events), replay(named)
    assert folded is not None and folded_named is not None
    assert (folded.status, folded.transcript, folded.final_reply) == (
        folded_named.status,
        folded_named.transcript,
        folded_named.final_reply,
    )
