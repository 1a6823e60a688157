"""What the runtime remembers across runs: a guest's profile and a session's lane (JetStream KV records)."""

from __future__ import annotations

import msgspec


class GuestProfile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One guest's record (`<ns>_guests`, key `guest.<tenant>.<digest>`): read into the model's context at the start
    of a run (journaled in `run.started`), preferences written by the `remember_preference` tool."""

    guest_id: str
    # The only address a message to this guest may go to; set by an operator, never by the model.
    verified_email: str = ""
    preferences: dict[str, str] = {}
    # A corporate traveller's bookings wait for their manager's approval (seed 001).
    corporate: bool = False
    manager: str = ""


class SessionTurn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finished run of a session, as the next run of the session is told about it."""

    run_id: str
    text: str
    reply: str = ""


class SessionLane(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who owns a guest session now (`<ns>_sessions`, key `session.<tenant>.<digest>`), fenced by its KV revision.

    `run_id` empty: no run is active, the next message starts one. `history`: the session's last finished runs."""

    run_id: str = ""
    history: list[SessionTurn] = []
