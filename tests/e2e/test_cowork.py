"""The second reference domain (examples/cowork) on a real stack: its registry, its own desk provider and its own
scripted model, each a process of its own, as an adopter runs them (`crashsafe up --registry … --providers …
--model-url …`). A desk is reserved and paid; the write executor SIGKILLed behind a provider that committed the
reservation and answers late still leaves one reservation, even with the member asking again meanwhile; a
declined card gives the desk back; a dear pass waits for the member's yes; two tenants' members of one id each get
their own desk and pass, in their own provider account; and the example's evals pass."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashsafe.contracts.clients import Scope
from crashsafe.examples.cowork import desk_evals
from crashsafe.examples.cowork.desk_provider import DECLINED_CARD
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from tests.support.journals import trail
from tests.support.stack import (
    StackClient,
    auth_header,
    cli_env,
    crashsafe,
    guest_event,
    open_stack,
    operator_access,
    supervised,
)
from tests.support.waiting import eventually, unique

REGISTRY = "crashsafe.examples.cowork:registry"
MODEL_SCRIPT = "crashsafe.examples.cowork.desk_model:script"


@dataclass
class Cowork:
    client: StackClient
    provider: httpx.AsyncClient

    async def ledger(self, member: str, account: str | None = None) -> dict[str, list[dict[str, Any]]]:
        params = {"member_id": member} | ({"account": account} if account is not None else {})
        response = await self.provider.get("/_ledger", params=params)
        return dict(response.json())

    async def audit(self, state_dir: Path) -> tuple[int, str]:
        """`crashsafe audit` as an operator runs it against this deployment: its registry, its desk provider."""
        env = cli_env(self.client.stack, sandbox=False)
        env |= {
            "CRASHSAFE_REGISTRY": REGISTRY,
            "CRASHSAFE_SANDBOX_URL": str(self.provider.base_url).rstrip("/"),
        }
        done = await crashsafe("audit", "--state-dir", str(state_dir), env=env)
        return done.returncode, done.stdout + done.stderr

    async def say(self, member: str, text: str, session: str | None = None) -> str:
        body = guest_event(unique("ev"), guest_id=member, text=text, session_id=session or unique("s"))
        response = await self.client.gateway.post("/v1/events", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["run_id"])


async def _process(tmp: Path, name: str, *argv: str) -> tuple[asyncio.subprocess.Process, str]:
    """`python -m ARGV…` in its own process; the URL it prints once it listens."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *argv, stdout=asyncio.subprocess.PIPE, stderr=open(tmp / f"{name}.log", "wb")
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode()
    assert "listening on " in line, f"{name} did not start: {line!r}; see {tmp / f'{name}.log'}"
    return process, line.rsplit("listening on ", 1)[1].strip()


@pytest.fixture(scope="module")
async def cowork(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cowork]:
    tmp = tmp_path_factory.mktemp("cowork")
    provider, provider_url = await _process(tmp, "provider", "crashsafe.examples.cowork.desk_provider")
    model, model_url = await _process(tmp, "model", "crashsafe.testing", MODEL_SCRIPT)
    try:
        async with (
            # Its own nats-server: the session's knows the test registries' tool families, not an adopter's.
            open_stack(
                tmp / "stack",
                nats_url=None,
                registry=REGISTRY,
                providers_url=provider_url,
                model_url=model_url,
                env={"CRASHSAFE_ACK_WAIT_S": "1"},
            ) as client,
            httpx.AsyncClient(base_url=provider_url, timeout=20.0) as http,
        ):
            yield Cowork(client, http)
    finally:
        for process in (provider, model):
            process.terminate()
            await process.wait()


def _completed(events: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    steps = {e["step_no"] for e in events if e["type"] == "run.action_requested" and e["tool"] == tool}
    return [e for e in events if e["type"] == "run.action_completed" and e["step_no"] in steps]


async def test_a_desk_is_reserved_and_its_day_pass_paid_at_the_providers_price(cowork: Cowork) -> None:
    member = unique("member")
    run_id = await cowork.say(member, "Book a desk in the quiet zone on 2031-05-01")
    summary = await cowork.client.wait_terminal(run_id)
    assert summary["status"] == "completed", summary
    assert "is yours on 2031-05-01" in summary["reply"] and "EUR 25.00" in summary["reply"], summary["reply"]
    ledger = await cowork.ledger(member)
    (reservation,) = ledger["reservations"]
    (day_pass,) = ledger["passes"]
    assert reservation["status"] == "reserved" and reservation["zone"] == "quiet"
    assert (day_pass["status"], day_pass["amount_cents"]) == ("paid", reservation["price_cents"])
    events = await cowork.client.events(run_id)
    (asked,) = [e for e in events if e["type"] == "run.action_requested" and e["tool"] == "buy_day_pass"]
    assert asked["args"]["amount_cents"] == 2_500  # the server's price, from the reservation's answer
    assert asked["key"].startswith("pass:") and _completed(events, "reserve_desk")[0]["key"].startswith(
        "desk:"
    )


async def test_the_desk_executor_killed_after_the_provider_committed_leaves_one_reservation(
    cowork: Cowork,
) -> None:
    """The provider commits the reservation and answers 10 s late; the executor is SIGKILLed while it waits, and
    the member, hearing nothing, asks again in a new conversation. One desk, one pass, both runs completed."""
    member, text = unique("member"), "Book a desk in the quiet zone on 2031-05-02"
    stack = cowork.client.stack
    await cowork.provider.put("/_faults", json={"late_ms": 10_000})
    async with supervised(stack):
        first = await cowork.say(member, text)

        async def committed() -> bool:
            return len((await cowork.ledger(member))["reservations"]) == 1

        await eventually(committed, what="the provider to commit the reservation", every_s=0.02)
        stack.kill("executor-desks")
        again = await cowork.say(member, text)
        ended = [await cowork.client.wait_terminal(r, timeout_s=120) for r in (first, again)]
        await eventually(lambda: stack.services["executor-desks"].restarts >= 1, what="executor-desks back")

    assert [s["status"] for s in ended] == ["completed", "completed"], ended
    ledger = await cowork.ledger(member)
    assert len(ledger["reservations"]) == 1, ledger
    assert [p["status"] for p in ledger["passes"]] == ["paid"], ledger
    (recovered,) = _completed(await cowork.client.events(first), "reserve_desk")
    assert recovered["status"] == "succeeded", recovered
    assert ("provider.lookup", "found") in trail(recovered), trail(recovered)


async def test_a_declined_card_gives_the_desk_back(cowork: Cowork) -> None:
    member = unique("member")
    await cowork.provider.put(f"/members/{member}/card", json={"card": DECLINED_CARD})
    run_id = await cowork.say(member, "Book a desk in the open zone on 2031-05-03")
    summary = await cowork.client.wait_terminal(run_id)
    assert summary["status"] == "completed" and "card_declined" in summary["reply"], summary
    ledger = await cowork.ledger(member)
    assert [r["status"] for r in ledger["reservations"]] == ["released"], ledger
    assert [p["status"] for p in ledger["passes"]] == ["declined"], ledger
    (released,) = _completed(await cowork.client.events(run_id), "release_desk")
    assert released["status"] == "succeeded" and released["key"].endswith(":release"), released


async def test_a_pass_above_the_limit_waits_for_the_members_yes(cowork: Cowork) -> None:
    member, session = unique("member"), unique("s")
    run_id = await cowork.say(member, "Book a desk in the office zone on 2031-05-04", session)
    waiting = await eventually(
        lambda: _awaiting(cowork.client, run_id), what="the run to wait for the member's approval"
    )
    # The agent words its own question: the desk's zone and day, at the provider's price.
    question = "Reply yes to pay EUR 90.00 for the day pass of a desk in the office zone on 2031-05-04"
    assert question in waiting["reply"], waiting
    assert (await cowork.ledger(member))["passes"] == []  # nothing charged while it waits
    assert await cowork.say(member, "yes", session) == run_id
    summary = await cowork.client.wait_terminal(run_id)
    assert summary["status"] == "completed" and "EUR 90.00" in summary["reply"], summary
    assert [(p["status"], p["amount_cents"]) for p in (await cowork.ledger(member))["passes"]] == [
        ("paid", 9_000)
    ]
    decided = [e for e in await cowork.client.events(run_id) if e["type"] == "run.approval_decided"]
    assert [e["decision"] for e in decided] == ["approved"]


async def test_two_tenants_members_of_one_id_each_get_a_desk_and_a_pass_in_their_own_account(
    cowork: Cowork, tmp_path: Path
) -> None:
    """Guarantee 8 in this domain: tenants acme and globex each send the very same event (one event id, member id,
    zone and day). Two runs, two desks, two passes, each in its own tenant's provider account; neither a conflict
    nor a shared record, neither tenant reads the other's run, and the audit finds nothing wrong (after this
    module's earlier runs, tenant demo's desks of other days have the desk ids these runs were given)."""
    stack = cowork.client.stack
    operator = await Broker.connect(stack.nats_url, "tests-cowork-keys", access=operator_access(stack))
    try:
        keys = ClientKeys(operator, cowork.client.ns)
        tenants = {
            t: (await keys.create(t, [Scope.EVENTS_WRITE, Scope.RUNS_READ], name=t)).key
            for t in ("acme", "globex")
        }
    finally:
        await operator.close()
    member, day = unique("member"), "2031-06-01"
    sent = guest_event(
        unique("ev"), guest_id=member, text=f"Book a desk in the quiet zone on {day}", session_id=unique("s")
    )
    gateways = {
        t: httpx.AsyncClient(base_url=stack.gateway_url, timeout=20.0, headers=auth_header(key))
        for t, key in tenants.items()
    }
    try:
        runs: dict[str, str] = {}
        for tenant, gateway in gateways.items():
            accepted = await gateway.post("/v1/events", json=sent)
            assert accepted.status_code == 202, accepted.text
            runs[tenant] = str(accepted.json()["run_id"])
        assert runs["acme"] != runs["globex"]
        for tenant, run_id in runs.items():
            summary = await cowork.client.wait_terminal(run_id)
            assert summary["status"] == "completed", (tenant, summary)
            assert f"is yours on {day}" in summary["reply"], (tenant, summary["reply"])

        # Each tenant reads its own run, and the other's is as unknown to it as a run never made.
        for tenant, other in (("acme", "globex"), ("globex", "acme")):
            own = await gateways[tenant].get(f"/v1/runs/{runs[tenant]}/events")
            assert own.status_code == 200 and own.json()["events"][0]["tenant"] == tenant, own.text
            for path in (f"/v1/runs/{runs[other]}", f"/v1/runs/{runs[other]}/events"):
                theirs = await gateways[tenant].get(path)
                assert theirs.status_code == 404, theirs.text
                assert theirs.json()["error"]["code"] == "run_not_found", theirs.text
    finally:
        for gateway in gateways.values():
            await gateway.aclose()

    # At the provider: one desk and one pass in each tenant's own account, the pass paying that account's desk.
    everyone = await cowork.ledger(member)
    assert [len(everyone[k]) for k in ("reservations", "passes")] == [2, 2], everyone
    for tenant, run_id in runs.items():
        ledger = await cowork.ledger(member, account=tenant)
        (reservation,) = ledger["reservations"]
        (day_pass,) = ledger["passes"]
        assert (reservation["status"], reservation["zone"], reservation["day"]) == ("reserved", "quiet", day)
        assert (day_pass["status"], day_pass["reservation_id"]) == ("paid", reservation["reservation_id"])
        events = await cowork.client.events(run_id)
        for tool, record in (("reserve_desk", reservation), ("buy_day_pass", day_pass)):
            (done,) = _completed(events, tool)
            assert done["status"] == "succeeded" and done["result"] == record, (tenant, tool, done)
    keys_of = {
        t: {e["key"] for e in await cowork.client.events(r) if e["type"] == "run.action_requested"}
        for t, r in runs.items()
    }
    assert not keys_of["acme"] & keys_of["globex"], keys_of
    code, out = await cowork.audit(tmp_path)
    assert code == 0 and "nothing wrong" in out, out


async def _awaiting(client: StackClient, run_id: str) -> dict[str, Any] | None:
    summary = await client.summary(run_id)
    return summary if summary is not None and summary.get("awaiting_approval") else None


@pytest.mark.timeout(600)
async def test_the_examples_evals_pass(cowork: Cowork) -> None:
    stack = cowork.client.stack
    results = await desk_evals.run(stack.gateway_url, stack.api_key, stack.sandbox_url)
    assert not any(results.values()), desk_evals.report(results)
    assert len(results) == len(desk_evals.SCENARIOS)
