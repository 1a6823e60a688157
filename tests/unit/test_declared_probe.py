"""A registry's own synthetic probe (issue 32, item 13): declared with the registry, reads only (a write is a typed
refusal when the registry is built), run as the agent `synthetic` on the fixed route, and judged by its calls."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import pytest

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode, ProbeWrites
from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT, SyntheticResult
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase
from crashsafe.domain.probe import Probe, ProbeAgent, ProbeCall, probe_calls
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.services.reconciler.synthetic_probe import judge
from crashsafe.services.runtime.fixed_model import fixed_answer
from crashsafe.services.runtime.model import read_response

TODAY = date(2031, 5, 1)


async def _slots(args: dict[str, Any], key: str) -> dict[str, Any]:
    return {"slots": [{"slot_id": "s-0900", "day": args.get("day")}]}


def _contract(name: str, effect: Effect) -> ToolContract:
    keyed = effect is not Effect.READ
    return ToolContract(
        name=name,
        family="clinic",
        effect=effect,
        timeout_s=2.0,
        retry=RetryRule.KEYED if keyed else RetryRule.RETRY,
        key_rule=KeyRule.RUN_STEP if keyed else KeyRule.NONE,
    )


FIND_SLOTS = Tool(_contract("find_slots", Effect.READ), LocalOperation(_slots), audited=False)
FIND_VETS = Tool(_contract("find_vets", Effect.READ), LocalOperation(_slots), audited=False)
HOLD_SLOT = Tool(_contract("hold_slot", Effect.WRITE), LocalOperation(_slots), audited=False)
TOOLS = (FIND_SLOTS, FIND_VETS, HOLD_SLOT)


class ClinicAgent(AgentBase):
    name = "clinic"
    tools = {t.name: t.contract for t in TOOLS}
    config = AgentConfig(agent="clinic")


def in_a_month(today: date) -> dict[str, Any]:
    return {"day": (today + timedelta(days=30)).isoformat()}


PROBE = Probe(
    agent="clinic", calls=(ProbeCall("find_slots", in_a_month), ProbeCall("find_vets")), budget_s=20.0
)


def _registry(probe: Probe) -> Registry:
    return Registry.of(Registration(agent=ClinicAgent(), tools=TOOLS), probe=probe)


def test_a_declared_probe_runs_as_the_synthetic_agent_offering_its_reads_only() -> None:
    registry = _registry(PROBE)
    agent = registry.agent(SYNTHETIC_AGENT)
    assert isinstance(agent, ProbeAgent) and registry.probe is PROBE
    assert set(agent.tools) == {"find_slots", "find_vets"}  # never hold_slot: the runtime refuses it
    assert agent.config.agent == SYNTHETIC_AGENT and agent.config.routes[0].api == "fixed"
    assert agent.config.budget.deadline_s == 20.0 and agent.config.budget.max_steps == 6
    assert registry.default_agent == "clinic" and registry.agent("clinic").tools.keys() == {
        t.name for t in TOOLS
    }
    assert Registry.of(Registration(agent=ClinicAgent(), tools=TOOLS)).probe is None


@pytest.mark.parametrize("effect", [Effect.WRITE, Effect.MONEY])
def test_a_probe_naming_a_tool_that_is_not_a_read_is_a_typed_refusal(effect: Effect) -> None:
    writes = Probe(agent="clinic", calls=(ProbeCall("find_slots"), ProbeCall("hold_slot")))
    hold = Tool(_contract("hold_slot", effect), LocalOperation(_slots))
    with pytest.raises(ProbeWrites) as refused:
        Registry.of(Registration(agent=ClinicAgent(), tools=(FIND_SLOTS, FIND_VETS, hold)), probe=writes)
    assert refused.value.code == ErrorCode.PROBE_WRITES and refused.value.tools == ["hold_slot"]
    assert "reads only" in refused.value.message


@pytest.mark.parametrize(
    "probe",
    [
        Probe(agent="nobody", calls=(ProbeCall("find_slots"),)),
        Probe(agent="clinic", calls=(ProbeCall("send_fax"),)),
        Probe(agent="clinic", calls=()),
        Probe(agent="clinic", calls=(ProbeCall("find_slots"),), budget_s=0.0),
    ],
    ids=["unknown agent", "a tool the agent has not", "no call", "no budget"],
)
def test_a_probe_that_names_what_the_registry_lacks_is_refused(probe: Probe) -> None:
    with pytest.raises(ValueError, match="probe"):
        _registry(probe)


def _said(answer: bytes) -> Any:
    return read_response(answer, "synthetic-fixed")


def test_the_fixed_route_makes_the_probes_calls_in_order_then_says_how_they_went() -> None:
    text = PROBE.text(TODAY)
    assert probe_calls(text) == [("find_slots", {"day": "2031-05-31"}), ("find_vets", {})]
    items: tuple[dict[str, Any], ...] = ({"role": "user", "content": text},)
    first = _said(fixed_answer(items))
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("find_slots", {"day": "2031-05-31"})
    ]
    answered = (
        {"type": "function_call", "call_id": "c1", "name": "find_slots", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": json.dumps({"slots": []})},
    )
    second = _said(fixed_answer(items + answered))
    assert [c.name for c in second.tool_calls] == ["find_vets"]
    both = answered + (
        {"type": "function_call", "call_id": "c2", "name": "find_vets", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": json.dumps({"vets": []})},
    )
    done = _said(fixed_answer(items + both))
    assert not done.tool_calls and done.reply == "synthetic: ok: 2 call(s) answered"
    failed = answered[:1] + (
        {"type": "function_call_output", "call_id": "c1", "output": '{"error": {"message": "down"}}'},
    )
    assert _said(fixed_answer(items + failed)).reply == "synthetic: failed: a call failed: down"
    assert fixed_answer(items) == fixed_answer(items)  # deterministic


def _journal(*completed: tuple[str, str], asked: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n, (tool, status) in enumerate(completed, start=1):
        events.append({"type": "run.action_requested", "key": f"k{n}", "tool": tool})
        events.append({"type": "run.action_completed", "key": f"k{n}", "status": status, "result": {}})
    events += [{"type": "run.action_requested", "key": f"x{tool}", "tool": tool} for tool in asked]
    return [*events, {"type": "run.completed", "reply": "synthetic: ok: 2 call(s) answered"}]


def test_the_judge_passes_a_probe_whose_calls_all_succeeded_and_names_what_is_wrong_otherwise() -> None:
    ok, why = judge(_journal(("find_slots", "succeeded"), ("find_vets", "succeeded")), PROBE)
    assert ok == SyntheticResult.OK and why.startswith("2 call(s) answered")
    failed, why = judge(_journal(("find_slots", "succeeded"), ("find_vets", "failed")), PROBE)
    assert failed == SyntheticResult.FAILED and why.startswith("find_vets failed")
    short, why = judge(_journal(("find_slots", "succeeded")), PROBE)
    assert short == SyntheticResult.FAILED and "1 of the probe's 2" in why
    wrote, why = judge(_journal(("find_slots", "succeeded"), asked=("hold_slot",)), PROBE)
    assert wrote == SyntheticResult.FAILED and "hold_slot" in why
