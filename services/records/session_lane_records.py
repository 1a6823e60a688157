"""Session lanes in `<ns>_sessions`: which run owns a guest session now, the session's last finished runs, and which
run each message was handed to as a turn.

Exactly one run owns a session at a time: every change (decided in domain/session_lanes.py) is a compare-and-set on
the record's KV revision (create at revision 0, update at the revision read), so two gateways, or a gateway and a
runtime, never both win it."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from crashsafe.contracts.errors import LeaseConflict
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.streams import INBOUND_KEPT_S, sessions_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.record_ttls import kept_ttl
from crashsafe.domain.session_lanes import claimed, with_turn
from crashsafe.services.platform.jetstream import Broker

lane_encoder = msgspec.json.Encoder()
lane_decoder = msgspec.json.Decoder(SessionLane)
MAX_ROUNDS = 16
__all__ = ["SessionRecords", "with_turn"]  # `with_turn` read by tests that write a lane's history themselves


class SessionRecords:
    def __init__(self, broker: Broker, ns: Namespace) -> None:
        self.broker = broker
        self.ns = ns
        self.spec = sessions_spec(ns)

    async def get(self, tenant: str, session_id: str) -> tuple[SessionLane, int]:
        """The lane and its revision (0: no record yet)."""
        entry = await self.broker.kv_get(self.spec, self.ns.session_key(tenant, session_id))
        if entry is None or not entry.value:
            return SessionLane(), entry.revision if entry is not None else 0
        return lane_decoder.decode(entry.value), entry.revision

    async def change(
        self, tenant: str, session_id: str, change: Callable[[SessionLane], SessionLane | None]
    ) -> SessionLane:
        """Apply `change` by compare-and-set until it holds; None from `change`: leave the record as it is. Returns
        the lane as it then is."""
        key = self.ns.session_key(tenant, session_id)
        for _ in range(MAX_ROUNDS):
            entry = await self.broker.kv_get(self.spec, key)
            lane = lane_decoder.decode(entry.value) if entry is not None and entry.value else SessionLane()
            updated = change(lane)
            if updated is None or updated == lane:
                return lane
            try:
                # Refreshed on every write; a lane idle past it starts with no history (record_ttls.py).
                await self.broker.kv_write(
                    self.spec,
                    key,
                    lane_encoder.encode(updated),
                    revision=entry.revision if entry else 0,
                    ttl_s=kept_ttl(self.broker.retention.sessions_s),
                )
                return updated
            except LeaseConflict:
                continue  # another writer moved the lane: read it again and decide again
        raise LeaseConflict(key=key, expected_revision=0)

    async def mark_turn(self, tenant: str, message_run_id: str, holder: str) -> None:
        """Note that the message whose own run would be `message_run_id` is handed to `holder` as its turn, before
        the turn is journaled: a message that comes again finds where it went whatever runs the session has had
        since (the lane remembers only its last few). Overwritten by a later hand-over (the turn did not land)."""
        key = self.ns.turn_key(tenant, message_run_id)
        await self.broker.kv_write(self.spec, key, holder.encode(), revision=None, ttl_s=int(INBOUND_KEPT_S))

    async def turn_mark(self, tenant: str, message_run_id: str) -> str:
        """The run the message was last handed to as a turn ("" if none): where to look first, never proof."""
        entry = await self.broker.kv_get(self.spec, self.ns.turn_key(tenant, message_run_id))
        return entry.value.decode() if entry is not None else ""

    async def claim(self, tenant: str, session_id: str, run_id: str, guest_id: str = "") -> str:
        """Make `run_id` the session's owner if nobody owns it; the owner afterwards (`run_id` if it won)."""
        return (await self.claim_lane(tenant, session_id, run_id, guest_id)).run_id

    async def claim_lane(self, tenant: str, session_id: str, run_id: str, guest_id: str) -> SessionLane:
        """`claim`, answering the lane as it then is: its owner and the owner's guest, read in one compare-and-set."""
        return await self.change(tenant, session_id, lambda lane: claimed(lane, run_id, guest_id))
