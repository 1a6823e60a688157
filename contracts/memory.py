"""What the runtime remembers across runs: a guest's profile and a session's lane (JetStream KV records)."""

from __future__ import annotations

from typing import Literal

import msgspec

# The tool family whose executor writes guest profiles (its NATS user alone may write the guests bucket).
MEMORY_FAMILY = "memory"
# What the model may remember about a guest: a closed vocabulary, so a profile never becomes a free-text
# channel from one run's model to the next (`remember_preference`'s `name`).
PreferenceName = Literal["quiet_room", "late_check_in", "early_check_in", "high_floor", "bed_type", "dietary"]
PREFERENCE_NAMES: tuple[str, ...] = PreferenceName.__args__  # type: ignore[attr-defined]
# A preference's value: short, and only plain words (letters, digits, spaces, `-` and `:`).
PREFERENCE_VALUE_MAX = 40
# How many of the action keys that wrote a profile it remembers: the lookup by key after a crash.
APPLIED_KEYS_KEPT = 64


class GuestProfile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One guest's record (`<ns>_guests`, key `guest.<tenant>.<digest>`): read into the model's context at the start
    of a run (journaled in `run.started`), preferences written by the `remember_preference` tool."""

    guest_id: str
    # The only address a message to this guest may go to; set by an operator, never by the model.
    verified_email: str = ""
    preferences: dict[str, str] = {}
    # A corporate guest's paid actions wait for their manager's approval (seed 001).
    corporate: bool = False
    manager: str = ""
    # The keys of the latest `remember_preference` actions applied to this record, written in the same
    # compare-and-set as their effect: "did key K take effect?" is answered from the record itself. Kept out
    # of `run.started` (the runtime journals the profile without them).
    applied: list[str] = []
    # How many writes made this record (each compare-and-set adds one). A run journals the version it started
    # from, and a preference's action key names it, so the same preference set again after it changed in
    # between (yes, no, yes) is a new action, not the first one's stale receipt.
    version: int = 0


class SessionTurn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finished run of a session, as the next run of the same guest in the session is told about it."""

    run_id: str
    text: str
    reply: str = ""
    # Whose turn it was: a session's history is (tenant, guest, session)'s, so a run is given only its own
    # guest's turns, and a session id another guest used before starts clean. "": written before turns carried
    # their guest; the turn's run journal then says whose it was.
    guest_id: str = ""


class SessionLane(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who owns a guest session now (`<ns>_sessions`, key `session.<tenant>.<digest>`), fenced by its KV revision.

    `run_id` empty: no run is active, the next message starts one. `history`: the session's last finished runs,
    each with its guest (a run is given only its own guest's).
    `guest_id`: the guest whose run owns it, written with `run_id` by whoever claims it, so the gateway refuses
    another guest's message before its 202 even while the owner's run has no journal yet ("": unknown, an older
    writer's record).
    `turns`: messages the gateway accepted as turns of `run_id` (its caps; 0 again whenever the owner changes)."""

    run_id: str = ""
    history: list[SessionTurn] = []
    guest_id: str = ""
    turns: int = 0


profile_encoder = msgspec.json.Encoder()
profile_decoder = msgspec.json.Decoder(GuestProfile)
