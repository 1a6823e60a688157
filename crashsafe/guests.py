"""`crashsafe guests show|set`: an operator reads a guest's profile and sets its verified address and corporate
fields (never its preferences: only the guest, through `remember_preference`, adds those)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from crashsafe.deployment import settings_for
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.guest_profile_tasks import guest_profile, set_guest_identity


async def guests_show(state_dir: Path, tenant: str, guest_id: str) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-guests") as broker:
        stored = await guest_profile(broker, settings.namespace, tenant, guest_id)
    if stored is None:
        print(f"no profile for guest {guest_id} of tenant {tenant}")
        return 1
    profile, revision = stored
    shown = msgspec.to_builtins(msgspec.structs.replace(profile, applied=[]))
    print(msgspec.json.format(msgspec.json.encode({**shown, "revision": revision}), indent=2).decode())
    return 0


async def guests_set(
    state_dir: Path,
    tenant: str,
    guest_id: str,
    *,
    email: str | None,
    corporate: bool | None,
    manager: str | None,
) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-guests") as broker:
        profile = await set_guest_identity(
            broker, settings.namespace, tenant, guest_id, email=email, corporate=corporate, manager=manager
        )
    print(
        f"guest {guest_id} of tenant {tenant}: email {profile.verified_email or '-'}"
        f"{'  corporate, manager ' + profile.manager if profile.corporate else ''}"
    )
    return 0
