"""The audit cross-checks journals against the providers and names every disagreement, and nothing else.

Here `audit()` on hand-built journals; tests/e2e/test_audit_stack.py audits a whole running stack."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crashsafe.contracts.audit import Finding, ProviderEffect
from crashsafe.contracts.keys import action_key, compensation_key
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    RunCompleted,
    RunEvent,
    RunStarted,
)
from crashsafe.domain.effect_audit import audit
from crashsafe.services.agents import stayhub

STAYHUB = stayhub()

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# Hand-built journals ------------------------------------------------------------------------------------------


@dataclass
class Run:
    """A run's journal built by hand, with the provider effects a faithful world would hold for it."""

    run_id: str
    events: list[RunEvent] = field(default_factory=list)
    step: int = 0
    tenant: str = ""
    guest_id: str = "g"
    agent: str = "booking"

    def __post_init__(self) -> None:
        self.events.append(
            RunStarted(
                run_id=self.run_id,
                at=T0,
                agent=self.agent,
                session_id="s",
                guest_id=self.guest_id,
                tenant=self.tenant,
                event_id=self.run_id,
                idempotency_key=self.run_id,
                input_hash="h",
                text="book",
                deadline_at=T0 + timedelta(seconds=90),
            )
        )

    def act(
        self,
        tool: str,
        args: dict[str, Any],
        status: str | None = "succeeded",
        result: dict[str, Any] | None = None,
        key: str | None = None,
        origin: str = "model",
        ref: str | None = None,
    ) -> str:
        """Journal an intent and, unless `status` is None, its receipt (`ref`: the effect's id at the provider).
        Returns the key."""
        self.step += 1
        key = key or action_key(self.run_id, self.step)
        contract = STAYHUB.tools[tool].contract
        self.events.append(
            ActionRequested(
                run_id=self.run_id,
                at=T0,
                step_no=self.step,
                call_id=f"call-{self.step}",
                tool=tool,
                family=contract.family,
                args=args,
                key=key,
                input_hash="h",
                timeout_s=contract.timeout_s,
                deadline_at=T0 + timedelta(seconds=contract.timeout_s),
                origin=origin,
            )
        )
        if status is not None:
            self.events.append(
                ActionCompleted(
                    run_id=self.run_id,
                    at=T0,
                    step_no=self.step,
                    key=key,
                    status=status,  # type: ignore[arg-type]
                    result=result or {},
                    provider_ref=ref,
                )
            )
        return key

    def end(self) -> Run:
        self.events.append(RunCompleted(run_id=self.run_id, at=T0, reply="done"))
        return self


@dataclass
class World:
    """Journals, the providers' ledger and their by-key answers, as audit() takes them."""

    runs: list[Run] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    found: dict[str, bool] = field(default_factory=dict)

    def effect(self, kind: str, key: str, ref: str) -> None:
        self.ledger.append({"kind": kind, "key": key, "ref": ref, "guest_id": "g", "amount_cents": 24000})
        self.found[key] = True

    def findings(self) -> list[Finding]:
        effects = [ProviderEffect(kind=e["kind"], key=e["key"], ref=e["ref"]) for e in self.ledger]
        journals = {r.run_id: r.events for r in self.runs}
        return audit(journals, effects, self.found, STAYHUB.tools, STAYHUB.audit_rules)


def paid_run(world: World, run_id: str, *, end: bool = True) -> dict[str, str]:
    """search, hold, pay, email, CRM: journaled and held by the providers. Returns the keys by tool."""
    run = Run(run_id)
    booking_id, payment_id = f"bk_{run_id}", f"pay_{run_id}"
    run.act("search_hotels", {"city": "Lisbon"}, result={"hotels": []})
    keys = {
        "create_booking": run.act(
            "create_booking", {"hotel_id": "lis-1"}, result={"booking_id": booking_id, "total_cents": 24000}
        ),
        "create_payment": run.act(
            "create_payment",
            {"booking_id": booking_id, "amount_cents": 24000},
            result={"payment_id": payment_id},
        ),
        "send_confirmation_email": run.act(
            "send_confirmation_email", {"booking_id": booking_id}, result={"email_id": f"em_{run_id}"}
        ),
        "update_crm": run.act(
            "update_crm", {"booking_id": booking_id}, result={"crm_update_id": f"crm_{run_id}"}
        ),
    }
    for tool, kind, ref in (
        ("create_booking", "booking", booking_id),
        ("create_payment", "charge", payment_id),
        ("send_confirmation_email", "email", f"em_{run_id}"),
        ("update_crm", "crm_update", f"crm_{run_id}"),
    ):
        world.effect(kind, keys[tool], ref)
    world.runs.append(run.end() if end else run)
    return keys | {"booking_id": booking_id, "payment_id": payment_id}


def kinds(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.kind, f.key) for f in findings)


# audit(), one finding kind at a time --------------------------------------------------------------------------


def test_a_faithful_world_has_no_findings() -> None:
    world = World()
    paid_run(world, "run_a")
    paid_run(world, "run_b")
    assert world.findings() == []


def test_an_effect_no_run_journaled_is_effect_without_intent() -> None:
    world = World()
    paid_run(world, "run_a")
    world.ledger.append(
        {"kind": "charge", "key": "rogue-1", "ref": "pay_rogue", "guest_id": "g", "amount_cents": 24000}
    )

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("effect_without_intent", "rogue-1", "")  # no run
    assert "charge" in finding.detail and "pay_rogue" in finding.detail


def test_two_effects_under_one_key_are_a_duplicate_effect() -> None:
    world = World()
    keys = paid_run(world, "run_a")
    world.ledger.append({"kind": "charge", "key": keys["create_payment"], "ref": "pay_again"})

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == (
        "duplicate_effect",
        keys["create_payment"],
        "run_a",
    )
    assert "2 effects" in finding.detail


def test_a_journaled_success_the_provider_does_not_hold_is_success_without_effect() -> None:
    world = World()
    keys = paid_run(world, "run_a")
    world.ledger = [e for e in world.ledger if e["key"] != keys["send_confirmation_email"]]
    world.found[keys["send_confirmation_email"]] = False

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == (
        "success_without_effect",
        keys["send_confirmation_email"],
        "run_a",
    )


@pytest.mark.parametrize("status", ["unknown", "failed", None])
def test_an_effect_an_ended_run_did_not_journal_as_success_is_effect_not_journaled(
    status: str | None,
) -> None:
    world = World()
    run = Run("run_a")
    key = run.act("create_payment", {"booking_id": "bk_1"}, status=status)
    world.runs.append(run.end())
    world.effect("charge", key, "pay_1")

    (finding,) = world.findings()

    assert (finding.kind, finding.key) == ("effect_not_journaled", key)
    assert (status or "no receipt") in finding.detail


def test_an_effect_of_a_run_still_in_flight_is_not_yet_a_finding() -> None:
    world = World()
    run = Run("run_a")
    key = run.act("create_payment", {"booking_id": "bk_1"}, status=None)  # the receipt is on its way
    world.runs.append(run)
    world.effect("charge", key, "pay_1")

    assert world.findings() == []


def test_a_failed_write_the_provider_never_saw_is_consistent() -> None:
    world = World()
    run = Run("run_a")
    key = run.act("create_payment", {"booking_id": "bk_1"}, status="failed")
    world.runs.append(run.end())
    world.found[key] = False

    assert world.findings() == []


def test_two_journaled_charges_for_one_booking_are_a_double_charge() -> None:
    world = World()
    keys = paid_run(world, "run_a", end=False)
    run = world.runs[0]
    second = run.act(
        "create_payment", {"booking_id": keys["booking_id"]}, result={"payment_id": "pay_second"}
    )
    run.end()
    world.effect("charge", second, "pay_second")

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("double_charge", keys["create_payment"], "run_a")
    assert (
        keys["create_payment"] in finding.detail
        and second in finding.detail
        and keys["booking_id"] in finding.detail
    )


def test_a_failed_charge_is_no_charge_and_does_not_hide_the_ones_after_it() -> None:
    world = World()
    run = Run("run_a")
    run.act("create_booking", {"hotel_id": "lis-1"}, result={"booking_id": "bk_1"})
    run.act("create_payment", {"booking_id": "bk_1"}, status="failed")
    first = run.act("create_payment", {"booking_id": "bk_1"}, result={"payment_id": "pay_1"})
    second = run.act("create_payment", {"booking_id": "bk_1"}, result={"payment_id": "pay_2"})
    world.runs.append(run.end())
    world.effect("booking", action_key("run_a", 1), "bk_1")
    world.found[action_key("run_a", 2)] = False
    world.effect("charge", first, "pay_1")
    world.effect("charge", second, "pay_2")

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("double_charge", first, "run_a")
    assert (
        first in finding.detail and second in finding.detail and action_key("run_a", 2) not in finding.detail
    )


def _released_after_payment(refund: bool, end: bool) -> tuple[World, dict[str, str]]:
    world = World()
    keys = paid_run(world, "run_a", end=False)
    run = world.runs[0]
    release = compensation_key(keys["create_booking"], "release")
    run.act(
        "release_booking",
        {"booking_id": keys["booking_id"]},
        result={"booking_id": keys["booking_id"]},
        key=release,
        origin="compensation",
    )
    world.effect("booking_release", release, keys["booking_id"])
    if refund:
        refund_key = compensation_key(keys["create_payment"], "refund")
        args = {"payment_id": keys["payment_id"], "amount_cents": 24000, "booking_id": keys["booking_id"]}
        run.act("refund_payment", args, result={"refund_id": "re_1"}, key=refund_key, origin="compensation")
        world.effect("refund", refund_key, "re_1")
    if end:
        run.end()
    return world, keys


def test_a_charge_kept_for_a_released_booking_is_an_orphan_charge() -> None:
    world, keys = _released_after_payment(refund=False, end=True)

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("orphan_charge", keys["create_payment"], "run_a")
    assert keys["payment_id"] in finding.detail and keys["booking_id"] in finding.detail


def test_a_refunded_charge_for_a_released_booking_is_consistent() -> None:
    world, _ = _released_after_payment(refund=True, end=True)
    assert world.findings() == []


def test_a_released_booking_whose_refund_is_still_coming_is_not_yet_an_orphan() -> None:
    world, _ = _released_after_payment(refund=False, end=False)
    assert world.findings() == []


def test_a_duplicate_effect_under_a_compensation_key_names_the_run() -> None:
    world, keys = _released_after_payment(refund=False, end=False)
    release = compensation_key(keys["create_booking"], "release")
    world.ledger.append({"kind": "booking_release", "key": release, "ref": keys["booking_id"]})

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("duplicate_effect", release, "run_a")


def test_a_tool_with_no_record_to_check_or_not_in_this_deployment_is_not_judged() -> None:
    world = World()
    run = Run("run_a")
    key = run.act("create_payment", {"booking_id": "bk_1"}, result={"payment_id": "pay_1"})
    world.runs.append(run.end())
    world.found[key] = False  # a success the provider does not hold: a finding, if the tool can be checked
    journals = {r.run_id: r.events for r in world.runs}
    unaudited = dataclasses.replace(STAYHUB.tools["create_payment"], audited=False)

    assert [f.kind for f in world.findings()] == ["success_without_effect"]
    assert audit(journals, None, world.found, {"create_payment": unaudited}) == []
    assert audit(journals, None, world.found, {}) == []


def test_reads_and_keys_nobody_could_look_up_are_not_judged() -> None:
    world = World()
    run = Run("run_a")
    search = run.act("search_hotels", {"city": "Lisbon"})
    unanswered = run.act("create_booking", {"hotel_id": "lis-1"}, result={"booking_id": "bk_1"})
    world.runs.append(run.end())
    world.found[search] = False  # a read has no effect to find
    # `unanswered` is missing from found_by_key: the lookup gave no answer, so nothing can be said about it.
    world.ledger.append({"kind": "booking", "key": unanswered, "ref": "bk_1"})

    assert world.findings() == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["charge", "booking", "email"]).flatmap(
            lambda k: st.tuples(st.just(k), st.sampled_from(["x1", "x2", "x3", "y"]))
        )
    )
)
def test_every_stray_effect_is_named_once_per_entry_and_repeats_once_per_key(
    strays: list[tuple[str, str]],
) -> None:
    world = World()
    paid_run(world, "run_a")
    for kind, key in strays:
        world.ledger.append({"kind": kind, "key": f"rogue-{key}", "ref": "r"})

    found = Counter((f.kind, f.key) for f in world.findings())
    repeats = Counter(f"rogue-{key}" for _, key in strays)

    assert found == Counter(
        {("effect_without_intent", key): n for key, n in repeats.items()}
        | {("duplicate_effect", key): 1 for key, n in repeats.items() if n > 1}
    )


# Business keys: one key, many askers (runs and steps) ---------------------------------------------------------

HOLD = "hold:" + "d" * 64
CHARGE = "charge:" + "c" * 64


def test_a_later_run_told_the_hold_was_undone_does_not_make_the_released_hold_unjournaled() -> None:
    # run_a held and released; run_b asked the same business key and was answered `action_undone` (failed).
    world = World()
    first = Run("run_a")
    first.act("create_booking", {"hotel_id": "lis-1"}, result={"booking_id": "bk_1"}, key=HOLD)
    release = compensation_key(HOLD, "release")
    first.act("release_booking", {"booking_id": "bk_1"}, key=release, origin="compensation")
    world.runs.append(first.end())
    later = Run("run_b")
    later.act("create_booking", {"hotel_id": "lis-1"}, status="failed", key=HOLD)
    world.runs.append(later.end())
    world.effect("booking", HOLD, "bk_1")
    world.effect("booking_release", release, "bk_1")

    assert world.findings() == []


def test_a_success_one_run_journaled_is_checked_though_a_later_run_asks_the_same_key() -> None:
    world = World()
    first = Run("run_a")
    first.act("create_payment", {"booking_id": "bk_1"}, result={"payment_id": "pay_1"}, key=CHARGE)
    world.runs.append(first.end())
    later = Run("run_b")
    later.act("create_payment", {"booking_id": "bk_1"}, status=None, key=CHARGE)  # its replay is on its way
    world.runs.append(later)
    world.found[CHARGE] = False  # the provider holds no charge, though run_a journaled one

    (finding,) = world.findings()

    assert (finding.kind, finding.key, finding.run_id) == ("success_without_effect", CHARGE, "run_a")


def test_an_effect_an_ended_run_left_without_receipt_is_not_judged_while_another_asker_runs() -> None:
    world = World()
    live = Run("run_a")
    live.act("create_payment", {"booking_id": "bk_1"}, status=None, key=CHARGE)
    world.runs.append(live)
    ended = Run("run_b")
    ended.act("create_payment", {"booking_id": "bk_1"}, status=None, key=CHARGE)
    world.runs.append(ended.end())
    world.effect("charge", CHARGE, "pay_1")

    assert world.findings() == []


def test_stray_effects_under_a_business_key_name_the_run_that_journaled_it_or_none() -> None:
    world = World()
    run = Run("run_a")
    run.act("create_payment", {"booking_id": "bk_1"}, result={"payment_id": "pay_1"}, key=CHARGE)
    world.runs.append(run.end())
    world.effect("charge", CHARGE, "pay_1")
    world.ledger.append({"kind": "charge", "key": CHARGE, "ref": "pay_again"})
    world.ledger.append({"kind": "booking", "key": HOLD, "ref": "bk_rogue"})

    found = sorted((f.kind, f.key, f.run_id) for f in world.findings())

    assert found == [("duplicate_effect", CHARGE, "run_a"), ("effect_without_intent", HOLD, "")]


# Tenants ------------------------------------------------------------------------------------------------------


def alice_paid_in_demo(world: World) -> str:
    """Tenant demo's guest alice holds a room and pays 240.00 EUR; the payment's id."""
    run = Run("run_demo", tenant="demo", guest_id="alice")
    args = {"guest_id": "alice", "account": "demo"}
    run.act(
        "create_booking", {**args, "hotel_id": "lis-1"}, result={"booking_id": "bk_1", "total_cents": 24000}
    )
    run.act(
        "create_payment", {**args, "booking_id": "bk_1"}, result={"payment_id": "pay_1", "booking_id": "bk_1"}
    )
    world.runs.append(run.end())
    return "pay_1"


def test_another_tenants_run_listing_and_refunding_a_guests_payment_is_a_finding() -> None:
    """Issue 17: tenant evil's support run for "alice" listed and refunded demo's alice's payment, and the
    audit reported nothing (a guest id alone cannot tell: both tenants may have an alice)."""
    world = World()
    payment_id = alice_paid_in_demo(world)
    evil = Run("run_evil", tenant="evil", guest_id="alice", agent="support")
    listed = {"payments": [{"payment_id": payment_id, "guest_id": "alice", "amount_cents": 24000}]}
    listing = evil.act("find_payments", {"guest_id": "alice"}, result=listed)
    refund = evil.act(
        "refund_payment", {"payment_id": payment_id, "amount_cents": 15000}, result={"refund_id": "re_1"}
    )
    world.runs.append(evil.end())
    found = [f for f in world.findings() if f.kind == "other_tenants_guest"]
    assert {(f.key, f.run_id) for f in found} == {(listing, "run_evil"), (refund, "run_evil")}
    assert all("made for tenant 'demo' by run_demo" in f.detail for f in found)


def test_a_call_in_another_tenants_provider_account_is_a_finding_and_one_tenants_own_are_not() -> None:
    world = World()
    alice_paid_in_demo(world)
    mine = Run("run_demo_2", tenant="demo", guest_id="alice", agent="support")
    mine.act("find_payments", {"guest_id": "alice", "account": "demo"}, result={"payments": []})
    mine.act("refund_payment", {"payment_id": "pay_1", "amount_cents": 100, "account": "demo"})
    world.runs.append(mine.end())
    assert [f for f in world.findings() if f.kind == "other_tenants_guest"] == []
    astray = Run("run_evil", tenant="evil", guest_id="bob", agent="support")
    key = astray.act("find_payments", {"guest_id": "bob", "account": "demo"}, result={"payments": []})
    world.runs.append(astray.end())
    (finding,) = [f for f in world.findings() if f.kind == "other_tenants_guest"]
    assert (finding.key, finding.run_id) == (key, "run_evil") and "account 'demo'" in finding.detail


def test_an_id_a_write_was_answered_with_but_did_not_make_is_no_other_tenants_record() -> None:
    """Two tenants' holds of one room (other nights) each name the room; each made only its own booking (the
    provider's ref). The room is no record of either (the cowork example's desk ids met so, and the audit called
    tenant globex's reservation a touch of demo's). A booking made for another tenant is still a finding."""
    world = World()
    demo = Run("run_demo", tenant="demo", guest_id="alice")
    demo.act(
        "create_booking",
        {"hotel_id": "lis-1"},
        result={"booking_id": "bk_1", "room_id": "lis-1-101"},
        ref="bk_1",
    )
    world.runs.append(demo.end())
    acme = Run("run_acme", tenant="acme", guest_id="alice")
    acme.act(
        "create_booking",
        {"hotel_id": "lis-1"},
        result={"booking_id": "bk_2", "room_id": "lis-1-101"},
        ref="bk_2",
    )
    world.runs.append(acme.end())
    assert [f for f in world.findings() if f.kind == "other_tenants_guest"] == []
    stray = Run("run_acme_2", tenant="acme", guest_id="alice")
    key = stray.act(
        "create_payment",
        {"booking_id": "bk_1", "amount_cents": 100},
        result={"payment_id": "pay_9"},
        ref="pay_9",
    )
    world.runs.append(stray.end())
    (finding,) = [f for f in world.findings() if f.kind == "other_tenants_guest"]
    assert (finding.key, finding.run_id) == (key, "run_acme_2") and "touched bk_1" in finding.detail


def test_a_record_the_provider_says_is_another_accounts_is_a_finding_even_with_no_journal_of_its_maker() -> (
    None
):
    """The provider names the account of each record it answers with. A listing of tenant evil's run answered
    with demo's payment is a leak whoever made it: a run whose journal is gone, demo's own website, a run from
    before tenants. Tracing record ids to journaled writes alone missed every such record."""
    world = World()
    evil = Run("run_evil", tenant="evil", guest_id="alice", agent="support")
    evil.events[0] = msgspec.structs.replace(evil.events[0], guest_scope="tenant")  # type: ignore[type-var]
    stray = {"payment_id": "pay_web", "guest_id": "alice", "amount_cents": 9000, "account": "demo"}
    listing = evil.act(
        "find_payments", {"guest_id": "alice", "account": "evil"}, result={"payments": [stray]}
    )
    own = {"payment_id": "pay_own", "guest_id": "alice", "amount_cents": 100, "account": "evil"}
    evil.act("find_payments", {"guest_id": "alice", "account": "evil"}, result={"payments": [own]})
    world.runs.append(evil.end())
    (finding,) = [f for f in world.findings() if f.kind == "other_tenants_guest"]
    assert (finding.key, finding.run_id) == (listing, "run_evil")
    assert "pay_web" in finding.detail and "account 'demo'" in finding.detail
