"""The console's operating pages in a real headless Chromium against one stack of real processes: a stay over the
payment limit approved by clicking (and a stale click answered with the 409 in the page), a dead letter replayed by click
(once), "ask again now" resolving an unknown outcome by key, the provider's by-key view beside our receipt, and a
runs:read key that sees no button and whose forged POST is refused.

The stack runs without its reconciler, so nothing but the clicks here resolves or wakes what the pages show.
`CRASHSAFE_SCREENSHOTS=docs/console` also saves the screenshots docs/console.md shows (as tests/e2e/test_console.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, expect

from crashsafe.contracts.clients import Scope, split_key
from crashsafe.contracts.dead_letters import DeadLetter, dead_letter_encoder
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.evidence import bundle_decoder
from crashsafe.contracts.keys import action_key, run_id_for, tool_input_hash
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, Budget, RunHandedOff, RunStarted
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, tool_encoder
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import model_answered
from crashsafe.evidence_verify import verify
from crashsafe.natsd import NatsServer
from crashsafe.services.console.console_router import COOKIE, CSRF_FIELD, csrf_token
from crashsafe.services.console.pages_operate import SHOWN_LETTERS
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_journal import RunJournal
from tests.support.browser import browser, page, signed_in
from tests.support.holds import held_search
from tests.support.runs import call, reply_of
from tests.support.stack import StackClient, cli_env, crashsafe, open_stack
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT

__all__ = ["browser", "page"]  # the browser fixtures, used by name

SHOTS = os.environ.get("CRASHSAFE_SCREENSHOTS")


@pytest.fixture(scope="module")
async def stack(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(
        tmp_path_factory.mktemp("operate"), nats_url=nats_server.url, reconciler=False
    ) as client:
        yield client


async def _shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


async def _held(stack: StackClient, broker: Broker) -> tuple[str, str]:
    return await held_search(
        stack, broker, approver=Approver.MANAGER.value, ttl_s=3600, question="Your manager must approve this."
    )


async def _pending(stack: StackClient, approval_id: str) -> bool:
    response = await stack.gateway.get(f"/v1/approvals/{approval_id}")
    return response.status_code == 200 and response.json()["status"] == "pending"


async def _events(stack: StackClient, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in await stack.events(run_id) if e["type"] == kind]


async def test_an_approval_is_approved_by_clicking_and_a_stale_click_shows_the_409(
    stack: StackClient, broker: Broker, page: Page
) -> None:
    run_id, approval_id = await _held(stack, broker)
    _, stale_id = await _held(stack, broker)
    await eventually(lambda: _pending(stack, approval_id), what="the approval's record")
    await eventually(lambda: _pending(stack, stale_id), what="the other approval's record")
    base = stack.stack.gateway_url
    # The manager signs in with the stack's approver key: its admin key started these runs, so it may not decide.
    await signed_in(page, base, stack.approver_key, "/console/approvals")
    row, stale_row = page.locator(f"tr#{approval_id}"), page.locator(f"tr#{stale_id}")
    await expect(row).to_contain_text("search_hotels")
    await expect(row.locator(f"a[href='/console/runs/{run_id}']")).to_be_visible()

    # Decided behind the page's back: the click is answered with what the API answers (409), in the page.
    decided = await stack.manager.post(
        f"/v1/approvals/{stale_id}", json={"decision": "reject", "approver": "ana"}
    )
    assert decided.status_code == 200, decided.text
    await stale_row.locator("button.approve").click()
    await expect(page.locator("#notice")).to_contain_text("rejected by manager:ana, not pending")

    await page.locator(f"tr#{approval_id} button.approve").click()
    await expect(page.locator("#notice")).to_contain_text(f"approval {approval_id} approved")
    ended = await stack.wait_terminal(run_id, timeout_s=120)
    assert ended["outcome"] == "completed"
    (decision,) = await _events(stack, run_id, "run.approval_decided")
    assert decision["decision"] == "approved" and decision["decided_by"].startswith("manager:console:")


async def _read_only_key(stack: StackClient, broker: Broker) -> str:
    return (await ClientKeys(broker, stack.ns).create(stack.tenant, [Scope.RUNS_READ], "console-read")).key


async def test_a_read_only_key_sees_no_button_and_its_forged_post_is_refused(
    stack: StackClient, broker: Broker, page: Page
) -> None:
    run_id, approval_id = await _held(stack, broker)
    await eventually(lambda: _pending(stack, approval_id), what="the approval's record")
    hostile = "<script>window.pwned=1</script><img src=x onerror=window.pwned=1>"
    await _dead_letter(broker, stack, run_id, reason=hostile)
    key = await _read_only_key(stack, broker)
    base = stack.stack.gateway_url
    await signed_in(page, base, key, "/console/approvals")
    await expect(page.locator(f"tr#{approval_id}")).to_be_visible()
    assert await page.locator("button.approve, button.reject").count() == 0
    await page.goto(f"{base}/console/dead-letters")
    await expect(page.locator("table.dead-letters")).to_contain_text("<script>window.pwned=1</script>")
    assert await page.locator("button.replay, button.discard").count() == 0
    assert await page.evaluate("window.pwned") is None  # shown as text, never run
    await page.goto(f"{base}/console/reconciliation")
    assert await page.locator("button.ask").count() == 0

    # A forged form, even with this session's own CSRF token: the key has no runs:operate scope.
    parts = split_key(key)
    assert parts is not None
    form = {CSRF_FIELD: csrf_token(*parts), "decision": "approve", "input_hash": "x"}
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: key}, timeout=20) as forged:
        refused = await forged.post(f"/console/approvals/{approval_id}", data=form)
        assert refused.status_code == 403, refused.text
    # An operating key without the form's token (a cross-site post): refused too.
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: stack.api_key}, timeout=20) as cross:
        refused = await cross.post(f"/console/approvals/{approval_id}", data={"decision": "approve"})
        assert refused.status_code == 403, refused.text
    assert await _pending(stack, approval_id)


async def _dead_letter(
    broker: Broker, stack: StackClient, run_id: str, reason: str = "gave up"
) -> tuple[int, str]:
    """A runtime dead letter of an outcome for `run_id`, as services/platform/deliveries.py records one."""
    key = unique("k")
    outcome = ActionOutcome(
        run_id=run_id, step_no=2, tool="search_hotels", key=key, status=OutcomeStatus.UNKNOWN
    )
    letter = DeadLetter(
        service="runtime",
        subject=stack.ns.outcomes("booking", run_id),
        stream_seq=1,
        deliveries=20,
        reason=reason,
        code="handler_failed",
        payload=tool_encoder.encode(outcome).decode(),
        at=datetime.now(UTC),
    )
    published = await broker.publish(stack.ns.dead_letters("runtime"), dead_letter_encoder.encode(letter))
    return published.seq, key


async def test_a_dead_letter_is_replayed_once_by_click(
    stack: StackClient, broker: Broker, page: Page
) -> None:
    run_id, approval_id = await _held(stack, broker)
    await eventually(lambda: _pending(stack, approval_id), what="the approval's record")
    seq, key = await _dead_letter(broker, stack, run_id, reason="outcome handler failed 20 times")
    base = stack.stack.gateway_url
    await signed_in(page, base, stack.api_key, "/console/dead-letters")
    row = page.locator(f"tr#dead-{seq}")
    await expect(row).to_contain_text("outcome handler failed 20 times")
    await expect(row).to_contain_text(f"run {run_id} woken to re-send {key}")
    await _shot(page, "dead-letters.png")
    await row.locator("button.replay").click()
    await expect(page.locator("#notice")).to_contain_text(f"dead letter {seq} replayed")
    await expect(page.locator(f"tr#dead-{seq}")).to_have_count(0)  # settled: off the open list

    async def nudged() -> list[dict[str, Any]]:
        return [
            e for e in await _events(stack, run_id, "run.nudged") if e["by"].startswith("operator:console:")
        ]

    (nudge,) = await eventually(nudged, what="the replay's wake journaled")
    assert nudge["keys"] == [key]
    # The same click again (a second tab, a double submit): refused, nothing sent.
    parts = split_key(stack.api_key)
    assert parts is not None
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: stack.api_key}, timeout=20) as again:
        second = await again.post(
            f"/console/dead-letters/{seq}/replay", data={CSRF_FIELD: csrf_token(*parts)}
        )
    assert second.status_code == 409 and "already replayed" in second.text
    assert len(await nudged()) == 1

    # The CLI is the same logic: it sees the mark, refuses a second replay, and discards another letter.
    env = cli_env(stack.stack)
    listed = await crashsafe("dead-letters", "list", "--all", env=env)
    assert listed.returncode == 0, listed.stderr
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.split()[0] == str(seq)]
    assert "replayed by operator:console:" in line
    refused = await crashsafe("dead-letters", "replay", str(seq), env=env)
    assert refused.returncode == 1 and "already replayed" in refused.stderr
    other, _ = await _dead_letter(broker, stack, run_id, reason="another one")
    assert (await crashsafe("dead-letters", "discard", str(other), env=env)).returncode == 0
    still_open = await crashsafe("dead-letters", "list", env=env)
    assert {ln.split()[0] for ln in still_open.stdout.splitlines()} & {str(seq), str(other)} == set()
    assert len(await nudged()) == 1


async def _unknown_run(
    stack: StackClient, broker: Broker, status: OutcomeStatus = OutcomeStatus.UNKNOWN
) -> tuple[str, str, str]:
    """A booking run that handed off with its hold's outcome unknown, journaled as the runtime would have: (run
    id, key). Nobody has asked the provider about the key since (no reconciler in this stack)."""
    journal = RunJournal(broker, stack.ns)
    event = unique("ev")
    run_id = run_id_for(stack.tenant, event)
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=f"s-{event}",
        guest_id=unique("g"),
        event_id=event,
        idempotency_key=event,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
        tenant=stack.tenant,
    )
    args = {
        "hotel_id": "lis-1",
        "guest_id": started.guest_id,
        "check_in": "2031-12-01",
        "check_out": "2031-12-03",
    }
    hold = call("create_booking", args)
    key = action_key(run_id, 2)
    requested = ActionRequested(
        run_id=run_id,
        at=now,
        step_no=2,
        call_id=hold.call_id,
        tool="create_booking",
        family="booking",
        args=args,
        key=key,
        input_hash=tool_input_hash("create_booking", args),
        timeout_s=5.0,
        deadline_at=now + timedelta(seconds=5),
    )
    unknown = ActionCompleted(
        run_id=run_id,
        at=now,
        step_no=2,
        key=key,
        status=status,
        error=ErrorInfo(code="timeout", message="the provider did not answer in time; ask it by key")
        if status == OutcomeStatus.UNKNOWN
        else None,
        result={} if status == OutcomeStatus.UNKNOWN else {"booking_id": "bk_never_made"},
    )
    ended = RunHandedOff(
        run_id=run_id, at=now, reason="outcome_unknown", reply="A person will confirm your room."
    )
    seq = await journal.append(started, 0)
    seq = await journal.append(model_answered(fold_run(None, started), reply_of((hold,)), now), seq)
    for e in (requested, unknown, ended):
        seq = await journal.append(e, seq)
    return run_id, key, started.guest_id


async def test_ask_again_now_resolves_an_unknown_by_key_and_the_provider_view_shows_it(
    stack: StackClient, broker: Broker, page: Page
) -> None:
    run_id, key, guest = await _unknown_run(stack, broker)
    base = stack.stack.gateway_url
    await signed_in(page, base, stack.api_key, "/console/reconciliation")
    row = page.locator(f"tr#unknown-{run_id}-2")
    await expect(row).to_contain_text(key)
    await expect(row).to_contain_text("did not answer in time")
    await _shot(page, "reconciliation.png")

    # Before the ask: the provider never saw the key (absent), our receipt says unknown.
    await page.goto(f"{base}/console/runs/{run_id}/provider")
    await expect(page.locator("tr[data-step='2']")).to_have_attribute("data-provider", "absent")

    await page.goto(f"{base}/console/reconciliation")
    await page.locator(f"tr#unknown-{run_id}-2 button.ask").click()
    await expect(page.locator("#notice")).to_contain_text(f"run {run_id} asked to resolve {key} by key")

    async def resolved() -> dict[str, Any] | None:
        done = [e for e in await _events(stack, run_id, "run.action_completed") if e["status"] != "unknown"]
        return done[0] if done else None

    late = await eventually(resolved, what="the late receipt journaled", timeout_s=60)
    assert late["status"] == "succeeded" and late["key"] == key
    await page.goto(f"{base}/console/reconciliation")
    await expect(page.locator(f"tr#unknown-{run_id}-2")).to_have_count(0)

    # The run page loads the provider's by-key view beside our receipt: one booking, the same id.
    await page.goto(f"{base}/console/runs/{run_id}")
    view = page.locator("#provider-view tr[data-step='2']")
    await expect(view).to_have_attribute("data-provider", "found")
    await expect(view).to_contain_text(late["result"]["booking_id"])
    await _shot(page, "run-provider-view.png")
    # Its evidence, downloaded from the run page: the run's journal as stored, the provider's answers, and a
    # chain the verifier finds whole (this journal was begun by the test's plain appends, unlinked).
    async with page.expect_download() as downloading:
        await page.locator("#evidence-download").click()
    bundle = bundle_decoder.decode(Path(await (await downloading.value).path()).read_bytes())
    assert bundle.run_id == run_id and any(
        a.key == key and a.answer == "found" for a in bundle.provider_answers
    )
    checked = verify(bundle)
    assert not [f for f in checked.findings if f.check in ("bundle", "chain") and f.status == "fail"], checked
    counts = await stack.counts(guest)
    assert counts["booking"] == 1

    # A journal that says a hold succeeded which the provider never made: the audit page names it.
    lying, lying_key, _ = await _unknown_run(stack, broker, status=OutcomeStatus.SUCCEEDED)
    await page.goto(f"{base}/console/audit")
    finding = page.locator("tr.finding", has_text=lying_key)
    await expect(finding).to_contain_text("success_without_effect")
    await expect(finding.locator(f"a[href='/console/runs/{lying}']")).to_be_visible()
    assert (
        await page.locator("tr.finding", has_text=key).count() == 0
    )  # the resolved one agrees with its provider
    await _shot(page, "audit.png")


async def test_another_tenants_key_sees_none_of_it_and_cannot_act_on_it(
    stack: StackClient, broker: Broker, page: Page
) -> None:
    run_id, approval_id = await _held(stack, broker)
    await eventually(lambda: _pending(stack, approval_id), what="the approval's record")
    seq, _ = await _dead_letter(broker, stack, run_id, reason="theirs")
    unknown_run, _, _ = await _unknown_run(stack, broker)
    key = (
        await ClientKeys(broker, stack.ns).create(
            "initech", [Scope.RUNS_READ, Scope.RUNS_OPERATE, Scope.APPROVALS_DECIDE], "other"
        )
    ).key
    base = stack.stack.gateway_url
    await signed_in(page, base, key, "/console/approvals")
    await expect(page.locator("main")).to_contain_text("No pending approvals")
    await page.goto(f"{base}/console/dead-letters")
    await expect(page.locator(f"tr#dead-{seq}")).to_have_count(0)
    await page.goto(f"{base}/console/reconciliation")
    await expect(page.locator(f"tr#unknown-{unknown_run}-2")).to_have_count(0)
    fragment = await page.goto(f"{base}/console/runs/{unknown_run}/provider")
    assert fragment is not None and fragment.status == 404
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: key}, timeout=20) as other:
        evidence = await other.get(f"/console/runs/{unknown_run}/evidence")
        assert evidence.status_code == 404, evidence.text  # another tenant's run: not even its journal's size

    # Its forms, well made and with its own token, for our records: the answer a missing one gets.
    parts = split_key(key)
    assert parts is not None
    token = {CSRF_FIELD: csrf_token(*parts)}
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: key}, timeout=20) as other:
        decided = await other.post(
            f"/console/approvals/{approval_id}", data={**token, "decision": "approve", "input_hash": "x"}
        )
        assert decided.status_code == 404, decided.text
        replayed = await other.post(f"/console/dead-letters/{seq}/replay", data=token)
        assert replayed.status_code == 404, replayed.text
        asked = await other.post(f"/console/reconciliation/{unknown_run}", data=token)
        assert asked.status_code == 404, asked.text
    assert await _pending(stack, approval_id)
    assert not [
        e for e in await _events(stack, run_id, "run.nudged") if e["by"].startswith("operator:console:")
    ]


async def test_another_tenants_audit_asks_no_provider_about_our_keys_and_counts_none_of_our_runs(
    stack: StackClient, broker: Broker
) -> None:
    """Any runs:read key may load the audit page: it must audit that tenant's runs only. Before, every load by
    any tenant asked the providers about every keyed intent of every tenant (a tenant's reader could keep the
    executors busy answering for everyone) and told it how many runs and intents the whole deployment holds."""
    await _unknown_run(stack, broker)
    key = (await ClientKeys(broker, stack.ns).create("initech", [Scope.RUNS_READ], "other")).key
    async with httpx.AsyncClient(
        base_url=stack.stack.gateway_url, cookies={COOKIE: key}, timeout=60
    ) as other:
        page = await other.get("/console/audit")
    assert page.status_code == 200, page.text
    assert "audited 0 runs, 0 keyed intents" in " ".join(page.text.split()), page.text


async def test_pages_that_read_every_journal_are_read_one_at_a_time_and_a_crowd_is_told_to_come_back(
    stack: StackClient, broker: Broker
) -> None:
    """The reconciliation and audit pages read the whole RUNS stream into memory. A runs:read key may make
    thousands of requests a second: all of them at once would each hold a copy of every journal. One at a time
    per gateway; the others a 429 with Retry-After, and the gateway answers the API meanwhile."""
    await _unknown_run(stack, broker)
    key = (await ClientKeys(broker, stack.ns).create("initech", [Scope.RUNS_READ], "crowd")).key
    async with httpx.AsyncClient(
        base_url=stack.stack.gateway_url, cookies={COOKIE: key}, timeout=60
    ) as crowd:
        for path in ("/console/reconciliation", "/console/audit"):
            answers = await asyncio.gather(*(crowd.get(path) for _ in range(30)))
            codes = sorted(a.status_code for a in answers)
            assert 200 in codes and 429 in codes and set(codes) == {200, 429}, (path, codes)
            assert all(a.headers.get("retry-after") for a in answers if a.status_code == 429), path
            assert (await crowd.get(path)).status_code == 200, path  # and once it is done, the next is served


async def test_the_provider_view_asks_the_providers_at_a_bounded_rate_per_key(
    stack: StackClient, broker: Broker
) -> None:
    """Each load of a run's provider view asks the executors (and through them the providers) about every
    action of the run. A runs:read key at its full API rate would turn the gateway into an amplifier against
    the providers the executors need for real actions: past a small burst, a 429."""
    run_id, _, _ = await _unknown_run(stack, broker)
    key = (await ClientKeys(broker, stack.ns).create(stack.tenant, [Scope.RUNS_READ], "viewer")).key
    async with httpx.AsyncClient(
        base_url=stack.stack.gateway_url, cookies={COOKIE: key}, timeout=60
    ) as viewer:
        answers = await asyncio.gather(*(viewer.get(f"/console/runs/{run_id}/provider") for _ in range(40)))
    codes = [a.status_code for a in answers]
    assert set(codes) == {200, 429} and codes.count(200) <= 12, codes


async def test_the_dead_letters_page_reads_the_newest_letters_only_however_many_are_kept(
    stack: StackClient, broker: Broker
) -> None:
    """The DEAD stream keeps 30 days of letters, however many a flood of poison made; every load of the page
    (any runs:read key) read them all into memory, and a tenant's load asked for each one's run too."""
    run_id, _, _ = await _unknown_run(stack, broker)
    seqs = [
        (await _dead_letter(broker, stack, run_id, reason=f"flood {i}"))[0] for i in range(SHOWN_LETTERS + 20)
    ]
    async with httpx.AsyncClient(
        base_url=stack.stack.gateway_url, cookies={COOKIE: stack.api_key}, timeout=60
    ) as admin:
        page = await admin.get("/console/dead-letters")
    assert page.status_code == 200
    assert page.text.count('<tr id="dead-') <= SHOWN_LETTERS
    assert f'id="dead-{seqs[-1]}"' in page.text and f'id="dead-{seqs[0]}"' not in page.text
    assert "crashsafe dead-letters list" in page.text  # where the older ones are


async def test_a_stay_over_the_limit_is_approved_by_clicking_and_charged_once(
    stack: StackClient, page: Page
) -> None:
    """The policy's own hold: a 14-night stay is over the payment limit, so the charge waits; the amount the page
    shows is the one the code computed, and the click lets the run pay and complete."""
    guest = unique("g")
    run_id = await stack.submit("Book a room in Lisbon from 2031-06-01 to 2031-06-15", guest_id=guest)

    async def waiting() -> dict[str, Any] | None:
        listed = (await stack.gateway.get("/v1/approvals", params={"status": "pending"})).json()["approvals"]
        return next((a for a in listed if a["run_id"] == run_id), None)

    record = await eventually(waiting, what="the charge held for approval", timeout_s=60)
    assert record["tool"] == "create_payment" and record["amount_cents"] > 150_000
    base = stack.stack.gateway_url
    # The admin key asked (it started the run): its decision, with its own session's token, is refused in the
    # page, naming the run and the key to decide with (issue 31, item 9).
    parts = split_key(stack.api_key)
    assert parts is not None
    form = {CSRF_FIELD: csrf_token(*parts), "decision": "approve", "input_hash": record["input_hash"]}
    async with httpx.AsyncClient(base_url=base, cookies={COOKIE: stack.api_key}, timeout=20) as admin:
        refused = await admin.post(f"/console/approvals/{record['approval_id']}", data=form)
    assert refused.status_code == 403 and f"started run {run_id}" in refused.text, refused.text
    assert "approver_key" in refused.text
    await signed_in(page, base, stack.approver_key, "/console/approvals")
    row = page.locator(f"tr#{record['approval_id']}")
    await expect(row).to_contain_text(f"{record['amount_cents'] / 100:.2f} {record['currency']}")
    await _shot(page, "approvals.png")
    await row.locator("button.approve").click()
    await expect(page.locator("#notice")).to_contain_text("approved")
    ended = await stack.wait_terminal(run_id, timeout_s=120)
    assert ended["outcome"] == "completed"
    assert (await stack.counts(guest))["charge"] == 1
