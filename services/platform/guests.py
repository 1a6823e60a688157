"""Guest profiles in JetStream KV: the verified address and remembered preferences a run starts with."""

from __future__ import annotations

from contracts.memory import GuestProfile


class GuestProfiles:
    async def read(self, tenant: str, guest_id: str) -> GuestProfile | None:
        return None
