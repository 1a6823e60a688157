"""The evidence console in a real headless Chromium against a whole stack: sign-in, tenants, live pages, evidence.

One stack and one browser for the module. `CRASHSAFE_SCREENSHOTS=docs/console` also saves the screenshots
docs/console.md shows.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, expect

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.subjects import StreamKind
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from tests.support.browser import EXPECT_TIMEOUT_MS, browser, page, signed_in
from tests.support.stack import StackClient, auth_header, guest_event, open_stack, operator_access
from tests.support.waiting import eventually, unique

__all__ = ["browser", "page"]  # the fixtures, imported for this module

HOSTILE = 'Book a room in Lisbon from 2031-12-01 to 2031-12-03 <script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
SHOTS = os.environ.get("CRASHSAFE_SCREENSHOTS")


@dataclass
class Console:
    world: StackClient
    url: str
    admin: str  # the stack's own admin key (tenant demo)
    acme_reader: str  # runs:read, tenant acme
    acme_writer: str  # events:write + runs:read, tenant acme
    other_reader: str  # runs:read, tenant other
    writer_only: str  # events:write, tenant acme: no runs:read
    keys: ClientKeys
    broker: Broker


@pytest.fixture(scope="module")
async def console(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Console]:
    async with open_stack(tmp_path_factory.mktemp("console"), nats_url=nats_server.url) as world:
        broker = await Broker.connect(world.stack.nats_url, "tests", access=operator_access(world.stack))
        keys = ClientKeys(broker, world.ns)
        try:
            yield Console(
                world=world,
                url=world.stack.gateway_url,
                admin=world.api_key,
                acme_reader=(await keys.create("acme", [Scope.RUNS_READ])).key,
                acme_writer=(await keys.create("acme", [Scope.EVENTS_WRITE, Scope.RUNS_READ])).key,
                other_reader=(await keys.create("other", [Scope.RUNS_READ])).key,
                writer_only=(await keys.create("acme", [Scope.EVENTS_WRITE])).key,
                keys=keys,
                broker=broker,
            )
        finally:
            await broker.close()


@pytest.fixture
async def world(console: Console) -> AsyncIterator[StackClient]:
    await console.world.clear_faults()
    yield console.world
    await console.world.clear_faults()


@pytest.fixture(scope="module")
async def acme_run(console: Console) -> str:
    """A finished run of tenant acme whose guest message carries script and an onerror handler."""
    async with httpx.AsyncClient(base_url=console.url, headers=auth_header(console.acme_writer)) as http:
        response = await http.post("/v1/events", json=guest_event(text=HOSTILE, guest_id=unique("g")))
        assert response.status_code == 202, response.text
    run_id = str(response.json()["run_id"])
    await console.world.wait_terminal(run_id)
    return run_id


async def _shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def _cookie_client(console: Console, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=console.url, cookies={"crashsafe_console": key}, timeout=20)


# Signing in -----------------------------------------------------------------------------------------------------


async def test_without_a_key_every_page_sends_you_to_sign_in(console: Console, page: Page) -> None:
    await page.goto(f"{console.url}/console/runs?status=running")
    await expect(page).to_have_url(f"{console.url}/console/signin?next=/console/runs")
    await expect(page.locator("input[name=key]")).to_be_visible()
    await _shot(page, "signin.png")


async def test_a_wrong_key_is_refused_and_a_forged_cookie_signs_nobody_in(
    console: Console, page: Page
) -> None:
    await page.goto(f"{console.url}/console/signin")
    await page.fill("input[name=key]", "csk_0123456789abcdef_" + "x" * 43)
    await page.click("button[type=submit]")
    await expect(page.get_by_role("alert")).to_have_text("That key is not valid.")

    await page.context.add_cookies(
        [
            {
                "name": "crashsafe_console",
                "value": "csk_0123456789abcdef_" + "y" * 43,
                "url": console.url + "/console",
            }
        ]
    )
    await page.goto(f"{console.url}/console/runs")
    await expect(page).to_have_url(f"{console.url}/console/signin?next=/console/runs&why=invalid")


async def test_a_key_without_runs_read_gets_a_403_page(console: Console, page: Page) -> None:
    await page.goto(f"{console.url}/console/signin")
    await page.fill("input[name=key]", console.writer_only)
    response_status = []
    page.on("response", lambda r: response_status.append(r.status) if r.url.endswith("/signin") else None)
    await page.click("button[type=submit]")
    await expect(page.locator("h1")).to_have_text("Not allowed")
    await expect(page.locator("main")).to_contain_text("has no runs:read scope")
    assert 403 in response_status


async def test_the_session_cookie_is_httponly_strict_and_scoped_to_the_console(
    console: Console, page: Page
) -> None:
    await signed_in(page, console.url, console.acme_reader)
    (cookie,) = [c for c in await page.context.cookies() if c["name"] == "crashsafe_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert await page.evaluate("document.cookie") == ""  # the key is out of reach of any script


async def test_a_revoked_key_is_signed_out_at_its_next_page(console: Console, page: Page) -> None:
    minted = await console.keys.create("acme", [Scope.RUNS_READ], name="to revoke")
    await signed_in(page, console.url, minted.key)
    await expect(page.locator("h1")).to_contain_text("Runs")
    await console.keys.revoke(minted.record.key_id)
    await page.reload()
    await expect(page).to_have_url(f"{console.url}/console/signin?next=/console/runs&why=revoked")


async def test_sign_out_needs_the_forms_csrf_token_and_then_drops_the_cookie(
    console: Console, page: Page
) -> None:
    async with _cookie_client(console, console.acme_reader) as http:
        forged = await http.post("/console/signout", data={"csrf": "0" * 64})
        assert forged.status_code == 403
        assert (await http.get("/console/runs")).status_code == 200  # still signed in
    await signed_in(page, console.url, console.acme_reader)
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(f"{console.url}/console/signin")
    await page.goto(f"{console.url}/console/runs")
    await expect(page).to_have_url(f"{console.url}/console/signin?next=/console/runs")


# Tenants --------------------------------------------------------------------------------------------------------


async def test_a_tenant_sees_its_run_and_another_tenant_does_not(
    console: Console, acme_run: str, page: Page
) -> None:
    await signed_in(page, console.url, console.acme_reader)
    await expect(page.locator(f"#run-{acme_run}")).to_be_visible()

    await signed_in(page, console.url, console.other_reader)
    await expect(page.locator("h1")).to_contain_text("Runs")
    await expect(page.locator(f"#run-{acme_run}")).to_have_count(0)
    response = await page.goto(f"{console.url}/console/runs/{acme_run}")
    assert response is not None and response.status == 404
    await expect(page.locator("main")).to_contain_text(acme_run)  # "run ... not found", as the API says
    async with _cookie_client(console, console.other_reader) as http:
        for path in (f"/console/runs/{acme_run}/stream?after=0", f"/console/runs/{acme_run}/projections"):
            assert (await http.get(path)).status_code == 404, path
        async with http.stream("GET", "/console/runs/stream?after=0") as live:
            assert live.status_code == 200  # the tenant's own live list: acme's rows never reach it
            assert live.headers["content-type"].startswith("text/event-stream")


async def test_hostile_guest_text_is_shown_as_text_and_never_runs(
    console: Console, acme_run: str, page: Page
) -> None:
    await signed_in(page, console.url, console.acme_reader, f"/console/runs/{acme_run}")
    block = page.locator("tr.evt.started pre")
    await expect(block).to_have_text(HOSTILE)
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("main script, main img").count() == 0


# Live pages -------------------------------------------------------------------------------------------------------


async def test_a_run_page_opened_during_a_booking_shows_the_steps_as_they_happen(
    console: Console, world: StackClient, page: Page
) -> None:
    # Every model call takes 1.5 s: the booking's five steps are still to come when the page has loaded.
    await world.arm("model", latency_ms=1500)
    await signed_in(page, console.url, console.admin)
    run_id, _ = await world.start_run()
    await eventually(lambda: world.summary(run_id), what=f"run {run_id} to start")
    await page.goto(f"{console.url}/console/runs/{run_id}")
    await page.evaluate("window.stillTheSamePage = true")
    first = await page.locator("tr.evt").count()
    await expect(page.locator("tr.evt.completed")).to_have_count(0)

    await expect(page.locator("tr.evt.intent", has_text="create_booking")).to_be_visible()
    await expect(page.locator("tr.evt.completed")).to_have_count(1, timeout=EXPECT_TIMEOUT_MS * 2)
    await expect(page.locator("#run-status")).to_have_text("completed")
    assert await page.evaluate("window.stillTheSamePage") is True, "the page was reloaded"
    journal = await world.events(run_id)
    await expect(page.locator("tr.evt")).to_have_count(len(journal))
    assert len(journal) > first
    seqs = [int(s) for s in await page.locator("tr.evt > td:first-child").all_inner_texts()]
    assert seqs == [e["seq"] for e in journal]  # every event once, in journal order
    # Each intent shows its idempotency key, as journaled.
    for intent in (e for e in journal if e["type"] == "run.action_requested"):
        await expect(page.locator(f"#evt-{intent['seq']}")).to_contain_text(intent["key"])


async def test_the_runs_page_shows_a_new_run_and_its_status_change_without_reload(
    console: Console, world: StackClient, page: Page
) -> None:
    await world.arm("model", latency_ms=600)
    await signed_in(page, console.url, console.admin)
    await page.evaluate("window.stillTheSamePage = true")
    run_id, guest = await world.start_run()
    row = page.locator(f"#run-{run_id}")
    await expect(row).to_be_visible()
    await expect(row).to_contain_text(guest)
    await expect(row.locator(".status")).to_have_text("completed", timeout=EXPECT_TIMEOUT_MS * 2)
    await expect(page.locator(f"#run-{run_id}")).to_have_count(1)
    assert await page.evaluate("window.stillTheSamePage") is True, "the page was reloaded"
    await _shot(page, "runs.png")


async def test_the_runs_page_filters_by_status_guest_and_session(
    console: Console, world: StackClient, page: Page
) -> None:
    run_id, guest = await world.start_run()
    await world.wait_terminal(run_id)
    await signed_in(page, console.url, console.admin, f"/console/runs?guest={guest}")
    await expect(page.locator("tr.run")).to_have_count(1)
    await page.goto(f"{console.url}/console/runs?guest={guest}&status=handed_off")
    await expect(page.locator("tr.run")).to_have_count(0)
    started = (await world.events(run_id))[0]
    await page.goto(f"{console.url}/console/runs?session={started['session_id']}&since=1h")
    await expect(page.locator("tr.run")).to_have_count(1)
    await page.goto(f"{console.url}/console/runs?since=yesterday-ish")
    await expect(page.get_by_role("alert")).to_contain_text("since")


async def test_a_recovered_receipt_shows_its_evidence_trail(
    console: Console, world: StackClient, page: Page
) -> None:
    """The payment committed and its answer was lost: the receipt was recovered by asking the provider by key,
    and the page shows each question and answer of that trail."""
    await world.arm("payments", drop_after_commit=1)
    run_id, _ = await world.start_run()
    await world.wait_terminal(run_id)
    (receipt,) = [e for e in await world.events(run_id) if e.get("via") == "provider_lookup"]
    await signed_in(page, console.url, console.admin, f"/console/runs/{run_id}")
    recovered = page.locator(f"#evt-{receipt['seq']}")
    await expect(recovered).to_have_class("evt recovered")
    await expect(recovered).to_contain_text(receipt["key"])
    await expect(recovered).to_contain_text(receipt["provider_ref"])
    lines = recovered.locator("tr.evidence-line")
    await expect(lines).to_have_count(len(receipt["evidence"]))
    for i, line in enumerate(receipt["evidence"]):
        await expect(lines.nth(i)).to_contain_text(line["asked"])
        await expect(lines.nth(i)).to_contain_text(line["answer"])
    ns = console.world.ns
    first = await console.broker.first_on_subject(ns.stream(StreamKind.RUNS), ns.run_events(run_id))
    assert first is not None
    await expect(page.locator("#trace-id")).to_have_text(first.headers["traceparent"].split("-")[1])
    await expect(page.locator("#projections tr", has_text="delivered").first).to_be_visible()
    await _shot(page, "run.png")


async def test_live_streams_leave_no_consumer_behind(console: Console, acme_run: str) -> None:
    """A live page reads by direct get from its last sequence: opening and dropping streams creates nothing on
    the server that could outlive them."""
    stream = console.world.ns.stream(StreamKind.RUNS)
    before = (await console.broker.js.stream_info(stream)).state.consumer_count
    async with _cookie_client(console, console.admin) as http:
        for path in [f"/console/runs/{acme_run}/stream?after=0", "/console/runs/stream?after=0"] * 3:
            async with http.stream("GET", path) as live:
                assert live.status_code == 200
                async for chunk in live.aiter_text():
                    if path.startswith(f"/console/runs/{acme_run}"):
                        assert "evt-1" in chunk  # the journal from sequence 0: the stream works
                    break
    after = (await console.broker.js.stream_info(stream)).state.consumer_count
    assert after == before


async def test_a_reconnecting_stream_resumes_after_the_last_event_it_got(
    console: Console, acme_run: str
) -> None:
    """EventSource sends the last event id back when it reconnects: the stream carries on after it, so a
    dropped connection shows no event twice."""
    journal = await console.world.events(acme_run)
    middle = journal[len(journal) // 2]["seq"]
    async with _cookie_client(console, console.acme_reader) as http:
        headers = {"accept": "text/event-stream", "last-event-id": str(middle)}
        async with http.stream("GET", f"/console/runs/{acme_run}/stream?after=0", headers=headers) as live:
            assert live.status_code == 200
            text = ""
            async for chunk in live.aiter_text():
                text += chunk.replace("\r\n", "\n")
                if "\n\n" in text:  # the end of the first event
                    break
    shown = {e["seq"] for e in journal if f'id="evt-{e["seq"]}"' in text}
    assert shown == {e["seq"] for e in journal if e["seq"] > middle}
    assert f"id: {journal[-1]['seq']}" in text


async def test_a_stream_asked_for_without_a_key_is_refused_with_a_status(
    console: Console, acme_run: str
) -> None:
    async with httpx.AsyncClient(base_url=console.url) as http:
        for path in (f"/console/runs/{acme_run}/stream", "/console/runs/stream"):
            response = await http.get(path, headers={"accept": "text/event-stream"})
            assert response.status_code == 401, path  # EventSource stops on it; no sign-in page as an event


async def test_a_tenants_live_runs_stream_carries_its_own_new_runs_and_never_anothers(
    console: Console,
) -> None:
    other_writer = (await console.keys.create("other", [Scope.EVENTS_WRITE])).key
    async with (
        _cookie_client(console, console.other_reader) as http,
        http.stream("GET", "/console/runs/stream", headers={"accept": "text/event-stream"}) as live,
    ):
        assert live.status_code == 200
        posted: dict[str, str] = {}
        for tenant, key in (("acme", console.acme_writer), ("other", other_writer)):
            async with httpx.AsyncClient(base_url=console.url, headers=auth_header(key)) as api:
                response = await api.post("/v1/events", json=guest_event(guest_id=unique("g")))
                assert response.status_code == 202, response.text
                posted[tenant] = str(response.json()["run_id"])
            # acme's whole run is journaled before other's starts: the stream has passed it when other's arrives.
            await console.world.wait_terminal(posted[tenant])
        text = ""
        async for chunk in live.aiter_text():
            text += chunk
            if f"run-{posted['other']}" in text and "completed" in text.split(f"run-{posted['other']}")[-1]:
                break  # its own run arrived, and its change to completed after it
    assert posted["acme"] not in text


async def test_a_fragment_asked_for_without_a_key_tells_htmx_to_go_to_sign_in(
    console: Console, acme_run: str
) -> None:
    async with httpx.AsyncClient(base_url=console.url) as http:
        page = f"{console.url}/console/runs/{acme_run}"
        headers = {"hx-request": "true", "hx-current-url": page}
        response = await http.get(f"/console/runs/{acme_run}/projections", headers=headers)
    assert response.status_code == 401
    # Back to the page the fragment belongs to once signed in, never to the bare fragment.
    assert response.headers["hx-redirect"] == f"/console/signin?next=/console/runs/{acme_run}"


async def test_every_html_answer_of_the_console_carries_its_security_headers(
    console: Console, acme_run: str
) -> None:
    """A fragment is HTML too: opened on its own (or framed by another site) it must carry the same policy as a
    page, so an escaping slip anywhere has the CSP behind it and no console answer can be framed."""
    async with _cookie_client(console, console.acme_reader) as http:
        for path in (
            "/console/signin",
            "/console/runs",
            f"/console/runs/{acme_run}",
            f"/console/runs/{acme_run}/projections",
            f"/console/runs/{acme_run}/provider",
            "/console/approvals",
            "/console/dead-letters",
            "/console/reconciliation",
            "/console/runs/run_000000000000000000000000",  # an error page
        ):
            response = await http.get(path)
            assert response.headers["content-type"].startswith("text/html"), path
            policy = response.headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
            assert response.headers.get("x-frame-options") == "DENY", path
            assert response.headers.get("x-content-type-options") == "nosniff", path


async def test_an_open_live_stream_ends_soon_after_its_key_is_revoked(
    console: Console, acme_run: str
) -> None:
    minted = await console.keys.create("acme", [Scope.RUNS_READ], name="revoked mid-stream")
    async with _cookie_client(console, minted.key) as http:
        async with http.stream("GET", "/console/runs/stream") as live:
            assert live.status_code == 200
            await console.keys.revoke(minted.record.key_id)
            seen = ""
            async for chunk in live.aiter_text():  # the keepalive and the recheck both come within RECHECK_S
                seen += chunk
                if "event: signed_out" in seen:
                    break
        assert "event: signed_out" in seen
        again = await http.get("/console/runs/stream", headers={"accept": "text/event-stream"})
        assert again.status_code == 401  # and its reconnect is refused with a status, not a stream
