"""Guest profiles as an operator reads and sets them (`crashsafe guests`): the verified address and corporate
fields, never the preferences (only the guest, through `remember_preference`, adds those)."""

from __future__ import annotations

from crashsafe.contracts.memory import GuestProfile
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.guest_profiles import GuestProfiles


async def guest_profile(
    broker: Broker, ns: Namespace, tenant: str, guest_id: str
) -> tuple[GuestProfile, int] | None:
    """The profile as runs read it, with its stored revision; None if the guest has none."""
    return await GuestProfiles(broker, ns).stored(tenant, guest_id)


async def set_guest_identity(
    broker: Broker,
    ns: Namespace,
    tenant: str,
    guest_id: str,
    *,
    email: str | None,
    corporate: bool | None,
    manager: str | None,
) -> GuestProfile:
    """Set what is given (None: left as it is); the profile as stored after."""
    return await GuestProfiles(broker, ns).set_identity(
        tenant, guest_id, verified_email=email, corporate=corporate, manager=manager
    )
