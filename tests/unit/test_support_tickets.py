"""Support tickets: built only from the journal, so the runtime and the reconciler's backstop write the same one."""

from __future__ import annotations

from datetime import timedelta

from crashsafe.contracts.run_events import HandOffReason, RunCompleted, RunHandedOff
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.support import ticket_for
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.open_work import OpenWork, due_tickets, observe
from tests.support.runs import RUN, T0, started


def handed(at_s: float = 5.0) -> RunHandedOff:
    return RunHandedOff(
        run_id=RUN,
        at=T0 + timedelta(seconds=at_s),
        reason=HandOffReason.LOOP,
        detail="same search 4 times",
        reply=handoff_reply(HandOffReason.LOOP),
    )


def test_the_reconciler_makes_sure_of_a_handed_off_runs_ticket_after_a_grace() -> None:
    work = OpenWork()
    start = started()
    observe(work, start)
    observe(work, handed())
    assert (
        due_tickets(work, T0 + timedelta(seconds=6), grace_s=2.0) == []
    )  # the runtime's publish comes first
    (ticket,) = due_tickets(work, T0 + timedelta(seconds=7), grace_s=2.0)
    assert ticket == ticket_for(
        handed(), tenant=start.tenant, agent="booking", guest_id="guest-1", session_id="sess-1"
    )
    assert (ticket.reason, ticket.reply) == ("loop", handoff_reply("loop"))
    assert work.parties == {}  # an ended run leaves nothing behind but its ticket to make sure of


def test_a_completed_run_has_no_ticket() -> None:
    work = OpenWork()
    observe(work, started())
    observe(work, RunCompleted(run_id=RUN, at=T0, reply="Booked."))
    assert due_tickets(work, T0 + timedelta(hours=1), grace_s=0.0) == [] and work.parties == {}


def test_a_ticket_has_one_subject_per_tenant_and_run() -> None:
    ns = Namespace("stayhub")
    assert ns.support("acme", RUN) == f"stayhub.support.acme.{RUN}"
    assert ns.support("", RUN) == f"stayhub.support._.{RUN}"  # a run from before tenants
