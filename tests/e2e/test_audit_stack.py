"""`crashsafe audit` on a whole running stack: nothing after clean runs, and each effect no run asked for named.
(`audit()` itself, one finding kind at a time, is tested in tests/unit/test_audit.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.workloads import REGISTRY as BENCH_REGISTRY
from crashsafe.services.platform.jetstream import Broker
from tests.support import inprocess
from tests.support.journals import of_type, step
from tests.support.stack import StackClient, cli_env, crashsafe
from tests.support.waiting import unique

# The whole stack: audit_all and `crashsafe audit` -------------------------------------------------------------


async def _audit(broker: Broker, client: StackClient) -> list[tuple[str, str]]:
    stack = client.stack
    settings = inprocess.settings_for(stack.nats_url, client.ns, sandbox_url=stack.sandbox_url)
    findings, stats = await inprocess.audit(broker, settings)
    assert stats.runs >= 1
    return sorted((f.kind, f.key) for f in findings)


async def _cli_audit(client: StackClient, state_dir: Path) -> tuple[int, str]:
    done = await crashsafe("audit", "--state-dir", str(state_dir), env=cli_env(client.stack))
    return done.returncode, done.stdout + done.stderr


async def _journaled_successes(client: StackClient, run_ids: list[str]) -> set[str]:
    keys: set[str] = set()
    for run_id in run_ids:
        events = await client.events(run_id)
        done = {e["step_no"] for e in of_type(events, "run.action_completed") if e["status"] == "succeeded"}
        keys |= {
            e["key"]
            for e in of_type(events, "run.action_requested")
            if e["step_no"] in done and e["tool"] != "search_hotels"
        }
    return keys


async def test_audit_finds_nothing_after_clean_runs_then_names_effects_no_run_asked_for(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, tmp_path: Path
) -> None:
    client = await start_stack()
    stack = client.stack
    run_ids: list[str] = []
    for fault in ({}, {}, {"drop_after_commit": 1}, {"decline": 1}):
        # Clean runs, a charge recovered by key, and a card declined (a typed refusal) with its booking released.
        if fault:
            await client.arm("payments", **fault)
        run_id, guest = await client.start_run()
        await client.wait_terminal(run_id)
        await client.clear_faults()
        run_ids.append(run_id)
    assert (await client.counts(guest))["booking_release"] == 1

    assert await _audit(broker, client) == []
    code, out = await _cli_audit(client, tmp_path / "cli")
    assert code == 0, out
    assert f"audited {len(run_ids)} runs" in out and "nothing wrong" in out

    # A second charge on a journaled booking, and a booking, under keys no run ever journaled.
    _, booking = step(await client.events(run_ids[0]), "create_booking")
    assert booking is not None
    held = booking["result"]
    charge_key, booking_key = unique("rogue-charge"), unique("rogue-booking")
    charged = await client.http.post(
        f"{stack.sandbox_url}/payments",
        # In the booking's own provider account (the tenant's): another account does not find it.
        headers={"Idempotency-Key": charge_key, "Provider-Account": held["account"]},
        json={
            "booking_id": held["booking_id"],
            "guest_id": held["guest_id"],
            "amount_cents": held["total_cents"],
            "currency": held["currency"],
        },
    )
    booked = await client.http.post(
        f"{stack.sandbox_url}/bookings",
        headers={"Idempotency-Key": booking_key},
        json={
            "hotel_id": "lis-2",
            "guest_id": "g-rogue",
            "check_in": "2031-12-01",
            "check_out": "2031-12-03",
        },
    )
    assert charged.status_code == booked.status_code == 201, (charged.text, booked.text)

    assert await _audit(broker, client) == sorted(
        [("effect_without_intent", charge_key), ("effect_without_intent", booking_key)]
    )
    code, out = await _cli_audit(client, tmp_path / "cli")
    assert code == 1, out
    assert f"WRONG effect_without_intent: run (none) key {charge_key}" in out
    assert f"WRONG effect_without_intent: run (none) key {booking_key}" in out

    # The providers forget everything: every journaled success is now a success without its effect.
    await client.sandbox.reset()
    expected = sorted(("success_without_effect", key) for key in await _journaled_successes(client, run_ids))
    assert expected and await _audit(broker, client) == expected


async def test_audit_of_completed_workflow_runs_finds_nothing(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack(executors=("noop",), reconciler=False, registry=BENCH_REGISTRY)
    run_id, _ = await client.start_run(text="five steps", agent="steps5")
    summary = await client.wait_terminal(run_id)
    assert summary["status"] == "completed" and summary["steps"] == 5
    assert await _audit(broker, client) == []
