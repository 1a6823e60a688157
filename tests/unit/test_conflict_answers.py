"""The business-key trap (issue 32, item 12): a key asked again with an argument outside its identity is a
conflict that says what the key already holds, to its own account and guest only; and `identity_gaps` points out
a keyed tool whose model arguments reach outside its identity."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.keys import business_key, tool_input_hash
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    RecordStatus,
)
from crashsafe.domain.conflict_answer import told
from crashsafe.domain.execution import Conflict, Record, classify
from crashsafe.domain.key_facts import owner_of
from crashsafe.domain.registry import LocalOperation
from crashsafe.domain.run_state import RunState
from crashsafe.sdk import (
    AgentBase,
    Effect,
    ErrorInfo,
    KeyRule,
    Registration,
    Registry,
    RetryRule,
    Tool,
    ToolContract,
    in_account,
)
from crashsafe.testing import Conflicted, ask, identity_gaps, play, reply

AT = datetime(2031, 5, 4, 9, 0, tzinfo=UTC)
HOLD_PARAMETERS = {
    "type": "object",
    "properties": {"pet_id": {"type": "string"}, "vet_id": {"type": "string"}, "day": {"type": "string"}}
    | {"slot_id": {"type": "string"}},
    "required": ["pet_id", "vet_id", "day", "slot_id"],
}
HOLD_SLOT = ToolContract(
    name="hold_slot",
    family="clinic",
    effect=Effect.WRITE,
    timeout_s=2.0,
    retry=RetryRule.KEYED,
    key_rule=KeyRule.BUSINESS,
    identity_kind="hold",
    identity=("pet_id", "vet_id", "day"),
    parameters=HOLD_PARAMETERS,
)


async def _noop(args: dict[str, Any], key: str) -> dict[str, Any]:
    return {}


class VetAgent(AgentBase):
    name = "vet"
    config = AgentConfig(agent="vet")

    def __init__(self, hold: ToolContract = HOLD_SLOT) -> None:
        self.tools = {hold.name: hold}

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return in_account(state, dict(args) | {"guest_id": state.guest_id})


def _registry(hold: ToolContract) -> Registry:
    return Registry.of(Registration(agent=VetAgent(hold), tools=(Tool(hold, LocalOperation(_noop)),)))


# What the executor answers ------------------------------------------------------------------------------------

KEY = business_key("hold", "clinic-1", {"pet_id": "rex", "vet_id": "v1", "day": "2031-05-06"})
FIRST_ARGS = {"pet_id": "rex", "vet_id": "v1", "day": "2031-05-06", "slot_id": "s-0900"}
HELD = {"hold_id": "hold_1", "slot_id": "s-0900", "status": "held"}


def _request(args: dict[str, Any], run_id: str = "run_" + "b" * 24, key: str = KEY) -> ActionRequest:
    return ActionRequest(
        run_id=run_id,
        step_no=2,
        tool="hold_slot",
        family="clinic",
        args=args,
        key=key,
        input_hash=tool_input_hash("hold_slot", args),
        timeout_s=2.0,
        deadline_at=AT + timedelta(seconds=30),
        requested_at=AT,
    )


def _held(account: str = "clinic-1", guest: str = "owner-1", key: str = KEY) -> tuple[Record, ActionRequest]:
    first = _request(FIRST_ARGS | {"account": account, "guest_id": guest}, run_id="run_" + "a" * 24, key=key)
    receipt = ActionOutcome(
        run_id=first.run_id,
        step_no=first.step_no,
        tool=first.tool,
        key=key,
        status=OutcomeStatus.SUCCEEDED,
        result=HELD,
        provider_ref="hold_1",
    )
    record = Record(
        key=key,
        input_hash=first.input_hash,
        status=RecordStatus.SUCCEEDED,
        attempts=1,
        outcome=receipt,
        run_id=first.run_id,
        step_no=first.step_no,
    )
    return record, first


def _conflict(record: Record, request: ActionRequest, undone: Record | None = None) -> ActionOutcome:
    plan = classify(record, request, 1, undone)
    assert isinstance(plan, Conflict)
    return plan.outcome


def test_another_slot_for_the_same_pet_vet_and_day_is_told_the_hold_it_already_has() -> None:
    record, first = _held()
    again = _request(FIRST_ARGS | {"slot_id": "s-1100", "account": "clinic-1", "guest_id": "owner-1"})
    answer = told(_conflict(record, again), again, record, None, owner_of(first.args))
    assert answer.status == OutcomeStatus.CONFLICT and answer.error is not None
    assert answer.error.code == ErrorCode.IDEMPOTENCY_CONFLICT and "existing" in answer.error.message
    assert answer.existing is not None
    assert (answer.existing.result, answer.existing.provider_ref) == (HELD, "hold_1")


def test_a_conflict_of_another_tenants_account_or_another_guest_shows_nothing_of_the_first() -> None:
    record, first = _held()
    for account, guest in (("clinic-2", "owner-1"), ("clinic-1", "owner-2"), ("", "owner-1")):
        other = _request(FIRST_ARGS | {"slot_id": "s-1100", "account": account, "guest_id": guest})
        answer = told(_conflict(record, other), other, record, None, owner_of(first.args))
        assert answer.existing is None, (account, guest)
        assert "hold_1" not in msgspec.json.encode(answer).decode()


def test_an_owner_not_known_or_an_undone_effect_shows_nothing() -> None:
    record, first = _held()
    again = _request(FIRST_ARGS | {"slot_id": "s-1100", "account": "clinic-1", "guest_id": "owner-1"})
    # Facts written by 0.2.0 carry no owner.
    assert told(_conflict(record, again), again, record, None, None).existing is None
    for status in (RecordStatus.SUCCEEDED, RecordStatus.STARTED):  # released, or a release under way
        undone = Record(key=KEY + ":release", input_hash="", status=status, attempts=1, outcome=None)
        answer = told(_conflict(record, again, undone), again, record, undone, owner_of(first.args))
        assert answer.existing is None, status
    failed = Record(key=KEY + ":release", input_hash="", status=RecordStatus.FAILED, attempts=1, outcome=None)
    assert told(_conflict(record, again, failed), again, record, failed, owner_of(first.args)).existing


def test_a_step_key_is_shown_to_its_own_run_only() -> None:
    step_key = "run_" + "a" * 24 + ":2"
    record, _ = _held(key=step_key)
    own = _request(FIRST_ARGS | {"slot_id": "s-1100"}, run_id="run_" + "a" * 24, key=step_key)
    other = _request(FIRST_ARGS | {"slot_id": "s-1100"}, run_id="run_" + "c" * 24, key=step_key)
    assert told(_conflict(record, own), own, record, None, None).existing is not None
    assert told(_conflict(record, other), other, record, None, None).existing is None


# What the model sees next ------------------------------------------------------------------------------------


def test_the_models_next_input_carries_the_existing_hold() -> None:
    seen: list[dict[str, Any]] = []

    def model(state: RunState) -> Any:
        if not state.completed:
            return ask("hold_slot", pet_id="rex", vet_id="v1", day="2031-05-06", slot_id="s-1100")
        seen.extend(
            json.loads(i["output"]) for i in state.transcript if i.get("type") == "function_call_output"
        )
        return reply("You already hold 09:00 for Rex.")

    played = play(
        VetAgent(),
        "Rex, Dr. V1, the 6th, 11:00",
        model=model,
        tools={"hold_slot": Conflicted(existing=HELD, provider_ref="hold_1")},
    )
    assert played.status == "completed"
    (output,) = seen
    assert output["status"] == "conflict" and output["error"]["code"] == "idempotency_conflict"
    assert output["existing"] == {"result": HELD, "provider_ref": "hold_1"}
    (done,) = [d for _, d in played.state.completed]
    assert (
        done.existing is not None and done.existing.provider_ref == "hold_1"
    )  # the agent's code reads it too


# Pointing the trap out ---------------------------------------------------------------------------------------


def test_identity_gaps_points_out_a_keyed_tool_with_a_model_argument_outside_its_identity() -> None:
    (gap,) = identity_gaps(_registry(HOLD_SLOT))
    assert (gap.agent, gap.tool, gap.outside) == ("vet", "hold_slot", ("slot_id",))
    assert "outside_identity" in str(gap) and "idempotency_conflict" in str(gap)


def test_a_field_named_outside_the_identity_or_in_it_is_no_gap() -> None:
    declared = msgspec.structs.replace(HOLD_SLOT, outside_identity=("slot_id",))
    in_identity = msgspec.structs.replace(HOLD_SLOT, identity=("pet_id", "vet_id", "day", "slot_id"))
    assert identity_gaps(_registry(declared)) == [] and identity_gaps(_registry(in_identity)) == []
