"""Support tickets: one message per handed-off run, for the people who finish what the runtime could not."""

from __future__ import annotations

from datetime import datetime

import msgspec

from crashsafe.contracts.run_events import RunHandedOff


class SupportTicket(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="support.ticket"):
    """`{ns}.support.{tenant}.{run_id}` in `<NS>_SUPPORT`: one per subject, kept forever (discard new), so the
    runtime and the reconciler's backstop may both publish it and one ticket stands. Built only from the
    journal (`ticket_for`), so every publisher of a run's ticket writes the same bytes."""

    run_id: str
    tenant: str
    agent: str
    guest_id: str
    session_id: str
    reason: str  # a HandOffReason
    detail: str = ""
    reply: str = ""  # what the guest was told
    at: datetime  # when the run was handed off


def ticket_for(
    handed: RunHandedOff, *, tenant: str, agent: str, guest_id: str, session_id: str
) -> SupportTicket:
    return SupportTicket(
        run_id=handed.run_id,
        tenant=tenant,
        agent=agent,
        guest_id=guest_id,
        session_id=session_id,
        reason=handed.reason,
        detail=handed.detail,
        reply=handed.reply,
        at=handed.at,
    )


support_encoder = msgspec.json.Encoder()
support_decoder = msgspec.json.Decoder(SupportTicket)
