"""`crashsafe audit` over a deployment whose tools name their providers (docs/providers.md, "The audit"): each
named provider's listing is read, once per base URL, and no other provider's; one offering none is said so; a
provider a tool names that the deployment does not configure stops the audit with the variable to set. The CLI
runs as an operator runs it, against journals on the session's nats-server and sandboxes standing in for the
providers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec

from crashsafe.contracts.keys import action_key
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import ActionRequested, RunCompleted, RunEvent
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess, runs
from tests.support.named_providers import REGISTRY, TOOLS
from tests.support.nats_users import access
from tests.support.stack import crashsafe
from tests.support.waiting import unique

STAY = {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}
TOOL = {t.name: t for t in TOOLS}


async def _made(
    http: httpx.AsyncClient, url: str, path: str, key: str, body: dict[str, Any]
) -> dict[str, Any]:
    """An effect made at a provider under `key`, as a run's write (or anyone's) makes it."""
    response = await http.post(f"{url}{path}", json=body, headers={"Idempotency-Key": key})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def _journaled(
    broker: Broker, ns: Namespace, run_id: str, steps: list[tuple[str, dict[str, Any], dict[str, Any]]]
) -> None:
    """A completed run of the deployment's agent whose steps (tool, args, the provider's answer) all succeeded,
    step N under key `run_id:N`."""
    at = datetime.now(UTC)
    events: list[RunEvent] = [msgspec.structs.replace(runs.started(agent="steps1", at=at), run_id=run_id)]
    for step, (tool, args, answer) in enumerate(steps, start=1):
        asked = ActionRequested(
            run_id=run_id,
            at=at,
            step_no=step,
            call_id=f"c{step}",
            tool=tool,
            family=TOOL[tool].contract.family,
            args=args,
            key=action_key(run_id, step),
            input_hash="h",
            timeout_s=2.0,
            deadline_at=at + timedelta(seconds=30),
        )
        events += [asked, runs.receipt(asked, at, result=answer)]
    events.append(RunCompleted(run_id=run_id, at=at, reply="done"))
    journal = RunJournal(broker, ns)
    for event in events:
        await journal.append(event, (await journal.read(event.run_id))[1])


async def test_the_audit_reads_each_named_providers_listing_once_and_no_other_provider(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    settings = inprocess.settings_for(nats_server.url, namespace)
    await inprocess.provisioned(settings)
    crm = f"http://127.0.0.1:{free_port()}"  # nobody there: no listing, and send_note has no lookup
    run_id = "run_" + uuid.uuid4().hex[:24]
    async with (
        inprocess.sandbox_server() as hotels,
        inprocess.sandbox_server() as elsewhere,
        httpx.AsyncClient(timeout=10) as http,
    ):
        # The run's hold and charge, made at `hotels` (where `billing` is too) under the keys it journaled.
        hold_key, charge_key = action_key(run_id, 1), action_key(run_id, 2)
        hold = await _made(http, hotels, "/bookings", hold_key, {**STAY, "guest_id": "ana"})
        pay = {"booking_id": hold["booking_id"], "guest_id": "ana"}
        pay |= {"amount_cents": hold["total_cents"], "currency": hold["currency"]}
        charge = await _made(http, hotels, "/payments", charge_key, pay)
        await _journaled(
            broker,
            namespace,
            run_id,
            [
                ("create_booking", {**STAY, "guest_id": "ana"}, hold),
                ("create_payment", pay, charge),
                ("send_note", {"text": "hi"}, {"note_id": "n_1"}),
            ],
        )
        # Effects no run asked for: one at `hotels`, one at the default provider, which no audited tool names.
        stray, unlisted = unique("stray-hold"), unique("default-hold")
        strayed = await _made(http, hotels, "/bookings", stray, {**STAY, "guest_id": "bo"})
        await _made(http, elsewhere, "/bookings", unlisted, {**STAY, "guest_id": "bo"})

        env = {
            "CRASHSAFE_NATS_URL": nats_server.url,
            "CRASHSAFE_NAMESPACE": namespace.name,
            "CRASHSAFE_REGISTRY": REGISTRY,
            "CRASHSAFE_SANDBOX_URL": elsewhere,
            "CRASHSAFE_PROVIDER_HOTELS_URL": hotels,
            "CRASHSAFE_PROVIDER_BILLING_URL": hotels,
            "CRASHSAFE_PROVIDER_CRM_URL": crm,
        }
        creds = access(nats_server.url, Role.OPERATOR).creds
        if creds is not None:
            env["CRASHSAFE_NATS_CREDS"] = str(creds)
        audited = await crashsafe("audit", "--state-dir", str(tmp_path), env=env)
        # A provider a tool names that this deployment does not configure (a typo'd variable).
        typo = {k: v for k, v in env.items() if k != "CRASHSAFE_PROVIDER_HOTELS_URL"}
        typo["CRASHSAFE_PROVIDER_HOTEL_URL"] = hotels
        refused = await crashsafe("audit", "--state-dir", str(tmp_path), env=typo)

    out = audited.stdout + audited.stderr
    assert audited.returncode == 1, out
    # `hotels` and `billing` are one base URL: its three effects listed once (twice, each would be a duplicate).
    assert "audited 1 runs, 3 keyed intents (2 looked up), 3 provider effects listed" in out, out
    assert [line for line in out.splitlines() if line.startswith("WRONG")] == [
        f"WRONG effect_without_intent: run (none) key {stray}: booking {strayed['booking_id']} has no journaled intent"
    ], out
    assert unlisted not in out, "the default provider's listing was read, though no audited tool names it"
    (note,) = [line for line in out.splitlines() if line.startswith("NOTE")]
    assert note.startswith(f"NOTE provider crm at {crm} lists no effects"), note

    assert refused.returncode != 0 and "audited" not in refused.stdout, refused
    assert refused.stderr.strip() == (
        "crashsafe: CRASHSAFE_PROVIDER_HOTELS_URL='' is not usable: the base URL of provider 'hotels': "
        "tool 'create_booking' names it"
    ), refused.stderr
