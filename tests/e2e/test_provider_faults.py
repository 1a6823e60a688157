"""Each provider fault ends where the tool contract says: one effect per key, found by key, failed cleanly, or undone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from services.platform.jetstream import Broker
from services.platform.natsd import NatsServer
from services.platform.settings import Settings
from tests.support import inprocess
from tests.support.journals import of_type, step, trail
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import eventually
from tests.support.world import BOOKED_AND_PAID, NOTHING

CALL_UNKNOWN = ("provider.call", "unknown")
CALL_OK = ("provider.call", "ok")
LOOKUP_ABSENT = ("provider.lookup", "absent")
LOOKUP_FOUND = ("provider.lookup", "found")

# The keyed write tool behind each fault target the booking run calls.
WRITES = {
    "bookings": "create_booking",
    "payments": "create_payment",
    "emails": "send_confirmation_email",
    "crm": "update_crm",
}


@pytest.fixture(scope="module")
async def shared(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path_factory.mktemp("faults"), nats_url=nats_server.url) as client:
        yield client


@pytest.fixture
async def world(shared: StackClient) -> AsyncIterator[StackClient]:
    """The shared stack with no fault armed when the test starts or after it ends."""
    await shared.clear_faults()
    yield shared
    await shared.clear_faults()


# Lost or refused answers on keyed writes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "via", "expected_trail"),
    [
        # A 503 commits nothing: the lookup says absent, so calling again with the same key is safe.
        ("fail_5xx", "call", [CALL_UNKNOWN, LOOKUP_ABSENT, CALL_OK]),
        # The effect committed and the answer was lost: the lookup finds it, nothing is called twice.
        ("drop_after_commit", "provider_lookup", [CALL_UNKNOWN, LOOKUP_FOUND]),
        # The effect committed and the answer was garbage: the same, by lookup.
        ("malformed", "provider_lookup", [CALL_UNKNOWN, LOOKUP_FOUND]),
    ],
)
@pytest.mark.parametrize("target", list(WRITES))
async def test_one_lost_or_refused_answer_still_gives_one_effect(
    world: StackClient, target: str, fault: str, via: str, expected_trail: list[tuple[str, str]]
) -> None:
    tool = WRITES[target]
    await world.arm(target, **{fault: 1})
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, receipt = step(events, tool)

    assert summary["status"] == "completed", summary
    assert receipt is not None and receipt["status"] == "succeeded", receipt
    assert receipt["via"] == via
    assert trail(receipt) == expected_trail
    assert receipt["attempts"] == (2 if fault == "fail_5xx" else 1)
    assert await world.counts(guest) == BOOKED_AND_PAID
    assert target not in await world.faults(), "the armed fault was never met: the test proved nothing"


async def test_payment_receipt_found_by_key_names_the_providers_charge(world: StackClient) -> None:
    await world.arm("payments", drop_after_commit=1)
    run_id, guest = await world.start_run()

    await world.wait_terminal(run_id)
    request, receipt = step(await world.events(run_id), "create_payment")
    (charge,) = [e for e in (await world.ledger(guest))["entries"] if e["kind"] == "charge"]

    assert receipt is not None
    assert charge["key"] == request["key"]
    assert receipt["provider_ref"] == charge["ref"] == receipt["result"]["payment_id"]
    assert receipt["result"]["amount_cents"] == request["args"]["amount_cents"] == charge["amount_cents"]


# Reads and definitive failures --------------------------------------------------------------------------------


async def test_search_slower_than_its_timeout_fails_the_step_and_books_nothing(world: StackClient) -> None:
    # search_hotels: 2 s timeout, a read retried up to 3 attempts; 2.5 s of latency makes every attempt time out.
    await world.arm("search", latency_ms=2500)
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, receipt = step(events, "search_hotels")

    assert receipt is not None
    assert receipt["status"] == "failed"
    assert receipt["error"]["code"] == "provider_unavailable"
    assert receipt["attempts"] == 3
    assert trail(receipt) == [CALL_UNKNOWN] * 3  # a read is never looked up: it has no effect to find
    assert [e["tool"] for e in of_type(events, "run.action_requested")] == ["search_hotels"]
    assert summary["status"] == "completed"
    assert "searching for hotels" in summary["reply"] and "provider_unavailable" in summary["reply"]
    assert await world.counts(guest) == NOTHING


async def test_payment_refused_for_good_fails_and_the_held_room_is_released(world: StackClient) -> None:
    await world.arm(
        "payments", fail_5xx=50
    )  # every charge answers 503; lookups are not faulted and say absent
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    booking_request, booking = step(events, "create_booking")
    _, payment = step(events, "create_payment")
    release_request, release = step(events, "release_booking")
    ledger = await world.ledger(guest)

    assert payment is not None and payment["status"] == "failed"
    assert payment["error"]["code"] == "provider_unavailable"
    assert payment["attempts"] == 2  # create_payment's max_attempts, each confirmed absent before the next
    assert trail(payment) == [CALL_UNKNOWN, LOOKUP_ABSENT, CALL_UNKNOWN, LOOKUP_ABSENT]

    assert booking is not None
    assert release_request["origin"] == "compensation"
    assert release_request["key"] == f"{booking_request['key']}:release"
    assert release_request["args"] == {"booking_id": booking["result"]["booking_id"]}
    assert release_request["step_no"] > payment["step_no"]
    assert release is not None and release["status"] == "succeeded"

    assert ledger["counts"] == NOTHING | {"booking": 1, "booking_release": 1}
    (released,) = [e for e in ledger["entries"] if e["kind"] == "booking_release"]
    assert released["key"] == release_request["key"]

    # The model explains; it is never shown the compensation and nothing after the payment is attempted.
    assert [e["tool"] for e in of_type(events, "run.action_requested")] == [
        "search_hotels",
        "create_booking",
        "create_payment",
        "release_booking",
    ]
    assert summary["status"] == "completed"
    assert "taking the payment" in summary["reply"]


async def test_booking_refused_for_good_fails_with_nothing_to_undo(world: StackClient) -> None:
    await world.arm("bookings", fail_5xx=50)
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, booking = step(events, "create_booking")

    assert booking is not None and booking["status"] == "failed"
    assert booking["error"]["code"] == "provider_unavailable"
    assert not [e for e in of_type(events, "run.action_requested") if e["origin"] == "compensation"]
    assert summary["status"] == "completed" and "reserving the room" in summary["reply"]
    assert await world.counts(guest) == NOTHING


async def test_a_failed_confirmation_email_never_undoes_the_paid_booking(world: StackClient) -> None:
    await world.arm("emails", fail_5xx=50)
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, email = step(events, "send_confirmation_email")

    assert email is not None and email["status"] == "failed"
    assert email["attempts"] == 5  # send_confirmation_email's max_attempts
    assert summary["status"] == "completed"
    assert not [e for e in of_type(events, "run.action_requested") if e["origin"] == "compensation"]
    assert await world.counts(guest) == NOTHING | {"booking": 1, "charge": 1}


async def test_booking_slower_than_its_timeout_is_looked_up_and_fails_with_nothing_held(
    world: StackClient,
) -> None:
    # create_booking: 5 s timeout, 2 attempts, keyed. With 6 s of latency every call times out; the sandbox
    # drops a request whose caller hung up before it committed, so each lookup by key truly says absent.
    await world.arm("bookings", latency_ms=6000)
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, booking = step(events, "create_booking")

    assert booking is not None and booking["status"] == "failed", booking
    assert booking["error"]["code"] == "provider_unavailable"
    # A timed-out write is an unknown outcome: asked about by key before each new attempt, never retried blind.
    assert trail(booking) == [CALL_UNKNOWN, LOOKUP_ABSENT, CALL_UNKNOWN, LOOKUP_ABSENT]
    assert all("Timeout" in e["detail"] for e in booking["evidence"] if e["asked"] == "provider.call")
    assert not [e for e in of_type(events, "run.action_requested") if e["origin"] == "compensation"]
    assert summary["status"] == "completed" and "reserving the room" in summary["reply"]
    assert await world.counts(guest) == NOTHING


async def test_a_model_outage_is_retried_without_repeating_any_effect(world: StackClient) -> None:
    await world.arm("model", fail_5xx=3)
    run_id, guest = await world.start_run()

    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)

    assert summary["status"] == "completed", summary
    assert len(of_type(events, "run.started")) == 1
    assert len(of_type(events, "run.model_answered")) == 6  # the happy path's six answers, none asked twice
    assert await world.counts(guest) == BOOKED_AND_PAID
    assert "model" not in await world.faults()


# An outcome nobody can tell -----------------------------------------------------------------------------------


async def test_unknown_payment_is_never_released_and_is_found_once_lookups_return(world: StackClient) -> None:
    await world.arm("payments", drop_after_commit=1)
    await world.arm("lookups", fail_5xx=100_000)
    run_id, guest = await world.start_run()

    # Wait until the executor has asked by key at least twice and been refused: the outcome is now unknown.
    await eventually(
        lambda: _lookups_refused(world, at_least=2),
        what="the executor to ask by key and be refused twice",
        timeout_s=60,
    )
    summary = await world.summary(run_id)
    request, receipt = step(await world.events(run_id), "create_payment")

    assert summary is not None and summary["status"] == "running", summary
    assert summary["pending_actions"] == [request["key"]]
    assert receipt is None
    assert await world.counts(guest) == NOTHING | {"booking": 1, "charge": 1}

    await world.clear_faults()
    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)
    _, receipt = step(events, "create_payment")

    assert summary["status"] == "completed", summary
    assert receipt is not None and receipt["status"] == "succeeded"
    assert receipt["via"] == "provider_lookup"
    assert receipt["deliveries"] >= 2
    assert trail(receipt)[-1] == LOOKUP_FOUND
    assert not [e for e in of_type(events, "run.action_requested") if e["origin"] == "compensation"]
    assert await world.counts(guest) == BOOKED_AND_PAID


async def _lookups_refused(world: StackClient, at_least: int) -> bool:
    left = (await world.faults()).get("lookups", {}).get("fail_5xx", 0)
    return 100_000 - left >= at_least


@dataclass
class UnknownRun:
    """A payment whose answer was lost while lookups were down, run until the executor gave up on it."""

    client: StackClient
    settings: Settings
    run_id: str
    guest: str
    payment_key: str
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    max_charges: int
    releases_seen: int
    reconcile: dict[str, Any]
    events_after_reconcile: list[dict[str, Any]]


# The deliveries the payment executor spends on a key nobody can resolve before it reports `unknown`: a call and
# a few asks by key, then the last delivery within about a second (a stack's executor spends 12: ~40 s of naks).
FEW_DELIVERIES = 3


@pytest.fixture(scope="module")
async def unknown_run(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[UnknownRun]:
    """The payment executor and the reconciler run in this process, every other service as a real process: the
    executor so it spends only FEW_DELIVERIES, the reconciler so the test sets its clock (past the payment's
    deadline) instead of waiting for it."""
    state = tmp_path_factory.mktemp("unknown")
    async with open_stack(
        state / "stack",
        nats_url=nats_server.url,
        executors=("booking", "notify"),
        reconciler=False,
        env={"CRASHSAFE_ACK_WAIT_S": "1"},
    ) as client:
        settings = inprocess.settings_for(
            nats_server.url,
            client.ns,
            sandbox_url=client.stack.sandbox_url,
            data_dir=state / "payment-data",
            worker_id="payment",
        )
        async with inprocess.reconciler(settings) as reconciler:
            await client.arm("payments", drop_after_commit=1)
            await client.arm("lookups", fail_5xx=1_000_000)
            run_id, guest = await client.start_run()
            requested = await eventually(
                lambda: client.requested(run_id, "create_payment"), what="the payment to be requested"
            )

            # Nobody takes the payment yet. The reconciler, its clock past the deadline and grace, finds it
            # overdue: it asks the owning executor to resolve the key and wakes the run (a nudge in the journal).
            overdue = datetime.fromisoformat(requested["deadline_at"]) + timedelta(
                seconds=reconciler.grace_s + 1
            )

            async def nudged() -> bool:
                await reconciler.tick(overdue)
                nudges = of_type(await client.events(run_id), "run.nudged")
                return any(requested["key"] in n["keys"] for n in nudges)

            await eventually(nudged, what="the reconciler to nudge the overdue payment")

            async with inprocess.executor(settings, "payment", max_deliver=FEW_DELIVERIES):
                charges, releases = 0, 0

                async def ended() -> dict[str, Any] | None:
                    nonlocal charges, releases
                    counts = await client.counts(guest)
                    charges, releases = (
                        max(charges, counts["charge"]),
                        max(releases, counts["booking_release"]),
                    )
                    summary = await client.summary(run_id)
                    return summary if summary is not None and summary["status"] != "running" else None

                # The executor charges (the answer is lost), asks by key and is refused, naks, asks again at its
                # last delivery, and reports the outcome unknown: the run hands off.
                summary = await eventually(ended, what="the unknown payment to be handed off", every_s=0.25)
                events = await client.events(run_id)
                request, _ = step(events, "create_payment")
                await client.clear_faults()
                response = await client.reconcile(run_id)
                assert response.status_code == 202, response.text
                yield UnknownRun(
                    client=client,
                    settings=settings,
                    run_id=run_id,
                    guest=guest,
                    payment_key=request["key"],
                    summary=summary,
                    events=events,
                    max_charges=charges,
                    releases_seen=releases,
                    reconcile=response.json(),
                    events_after_reconcile=await client.events(run_id),
                )


async def test_unknown_payment_is_handed_off_never_released_and_audit_finds_the_charge_by_key(
    unknown_run: UnknownRun, broker: Broker
) -> None:
    run = unknown_run
    _, receipt = step(run.events, "create_payment")

    assert run.summary["status"] == "handed_off"
    assert run.summary["handoff_reason"] == "outcome_unknown"
    assert receipt is not None and receipt["status"] == "unknown"
    assert receipt["error"]["code"] == "outcome_unknown"
    assert not of_type(run.events, "run.completed")
    assert not [
        e for e in run.events if e["type"] == "run.action_requested" and e["origin"] == "compensation"
    ]
    assert run.max_charges == 1 and run.releases_seen == 0
    # The reconciler nudged the run while the payment was overdue: evidence that someone kept asking.
    assert [e for e in of_type(run.events, "run.nudged") if run.payment_key in e["keys"]]

    # Faults cleared and reconciled by key: the journal learns the charge went through (a late, settling
    # receipt on the ended run), and the audit then finds nothing wrong.
    assert (
        await run.client.http.get(f"{run.client.stack.sandbox_url}/payments/by-key/{run.payment_key}")
    ).status_code == 200

    async def settled() -> dict[str, Any] | None:
        receipts = [
            e
            for e in of_type(await run.client.events(run.run_id), "run.action_completed")
            if e["key"] == run.payment_key and e["status"] == "succeeded"
        ]
        return receipts[-1] if receipts else None

    late = await eventually(settled, what="the unknown payment settled by key in the journal", timeout_s=60)
    assert late["via"] == "provider_lookup"
    assert ("provider.lookup", "found") in [(e["asked"], e["answer"]) for e in late["evidence"]]
    findings, _ = await inprocess.audit(broker, run.settings)
    assert findings == []
    assert (await run.client.counts(run.guest))["charge"] == 1


async def test_manual_reconcile_of_a_handed_off_unknown_run_asks_about_the_key(
    unknown_run: UnknownRun,
) -> None:
    run = unknown_run
    assert run.payment_key in run.reconcile["asked"], run.reconcile
    nudges = await eventually(
        lambda: _operator_nudges(run.client, run.run_id),
        what="an operator nudge in the journal",
        timeout_s=30,
    )
    assert run.payment_key in nudges[-1]["keys"]


async def _operator_nudges(client: StackClient, run_id: str) -> list[dict[str, Any]]:
    return [e for e in of_type(await client.events(run_id), "run.nudged") if e["by"].startswith("operator:")]


async def test_unknown_payment_receipt_carries_its_evidence_trail(unknown_run: UnknownRun) -> None:
    _, receipt = step(unknown_run.events, "create_payment")
    assert receipt is not None
    assert ("provider.lookup", "unknown") in trail(receipt)
