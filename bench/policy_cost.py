"""What the rules around the model cost per booking run: the policy engine, the schema check and the key choice,
timed on a real booking journal's decisions (pure code, one core), against planning the same calls whole."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import msgspec

from crashsafe.contracts.keys import KeyScheme, tool_input_hash
from crashsafe.contracts.run_events import ActionRequested, Origin, decode_event
from crashsafe.domain.argument_checks import check_arguments, check_schema
from crashsafe.domain.call_plan import argument_limits, argument_types, plan_calls
from crashsafe.domain.fold import fold_run
from crashsafe.domain.identity import choose_key
from crashsafe.domain.policy_engine import check_asked, check_policy
from crashsafe.services.agents.booking.booking_agent import BookingAgent

JOURNAL = Path(__file__).resolve().parent.parent / "tests" / "golden" / "journal_booking_runtime_killed.jsonl"
ROUNDS = 2000


def main() -> None:
    agent = BookingAgent()
    config = agent.config
    events = [decode_event(line) for line in JOURNAL.read_bytes().splitlines() if line.strip()]
    first = events[0]
    events[0] = msgspec.structs.replace(first, key_scheme=KeyScheme.BUSINESS)  # type: ignore[type-var]
    decisions = []  # (state before the call, the call, when)
    state = None
    for event in events:
        if isinstance(event, ActionRequested) and event.origin == Origin.MODEL and state is not None:
            call = next(c for c in state.unplanned if c.call_id == event.call_id)
            decisions.append((state, call, event.at))
        state = fold_run(state, event)  # type: ignore[arg-type]
    if not decisions:
        sys.exit("no model decisions in the journal")

    def rules_only() -> None:
        for before, call, now in decisions:
            contract = agent.tools[call.name]
            args = check_arguments(call.name, call.arguments, argument_limits(agent))
            assert isinstance(args, dict)
            check_asked(before, config, contract, args, Origin.MODEL)
            schema = argument_types(agent).get(call.name)
            if schema is not None:
                check_schema(call.name, args, schema)
            prepared = agent.prepare(before, contract, args)
            assert isinstance(prepared, dict)
            hashed = tool_input_hash(contract.name, prepared)
            check_policy(before, config, contract, prepared, hashed, Origin.MODEL, now)
            choose_key(before, contract, prepared, hashed, f"{before.run_id}:{before.next_step}")

    def prepare_only() -> None:
        for before, call, _ in decisions:
            contract = agent.tools[call.name]
            args = check_arguments(call.name, call.arguments, argument_limits(agent))
            assert isinstance(args, dict)
            prepared = agent.prepare(before, contract, args)
            assert isinstance(prepared, dict)
            tool_input_hash(contract.name, prepared)

    def planning() -> None:
        for before, call, now in decisions:
            plan_calls(before, agent, (call,), now, config=config)

    def per_run_us(work: object) -> float:
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(ROUNDS):
                work()  # type: ignore[operator]
            samples.append((time.perf_counter() - start) / ROUNDS * 1e6)
        return statistics.median(samples)

    rules, base, whole = per_run_us(rules_only), per_run_us(prepare_only), per_run_us(planning)
    print(f"booking run: {len(decisions)} model calls planned ({', '.join(c.name for _, c, _ in decisions)})")
    print(f"planning them whole (plan_calls):                 {whole:8.1f} µs per run")
    print(f"arguments + prepare + input hash (no rules):      {base:8.1f} µs per run")
    print(f"the same with the rules, schema and key choice:    {rules:8.1f} µs per run")
    print(f"the rules' own cost:                              {rules - base:8.1f} µs per run")


if __name__ == "__main__":
    main()
