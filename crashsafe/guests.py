"""`crashsafe guests show|set`: an operator reads a guest's profile and sets its verified address and corporate
fields (never its preferences: only the guest, through `remember_preference`, adds those)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from crashsafe.operations import settings_for
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.guest_profiles import GuestProfiles


async def guests_show(state_dir: Path, tenant: str, guest_id: str) -> int:
    settings = settings_for(state_dir)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-guests", fail_fast=True, access=settings.nats_access
    )
    try:
        stored = await GuestProfiles(broker, settings.namespace).stored(tenant, guest_id)
    finally:
        await broker.close()
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
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-guests", fail_fast=True, access=settings.nats_access
    )
    try:
        profile = await GuestProfiles(broker, settings.namespace).set_identity(
            tenant, guest_id, verified_email=email, corporate=corporate, manager=manager
        )
    finally:
        await broker.close()
    print(
        f"guest {guest_id} of tenant {tenant}: email {profile.verified_email or '-'}"
        f"{'  corporate, manager ' + profile.manager if profile.corporate else ''}"
    )
    return 0
