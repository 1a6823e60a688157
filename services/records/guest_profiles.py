"""Guest profiles in JetStream KV: the verified address and remembered preferences a run starts with."""

from __future__ import annotations

from dataclasses import field

import msgspec

from crashsafe.contracts.errors import (
    NOT_SENT,
    BrokerUnavailable,
    CrashsafeError,
    ErrorCode,
    LeaseConflict,
    RetryClass,
)
from crashsafe.contracts.memory import GuestProfile, profile_decoder, profile_encoder
from crashsafe.contracts.streams import guests_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker


class ProfileUnreadable(CrashsafeError):
    """A guest's record that does not decode as a profile (written past `crashsafe guests`): the run is retried
    later rather than started without the guest's verified address; the operator rewrites the record."""

    code = ErrorCode.PROFILE_UNREADABLE
    retry = RetryClass.RETRY_LATER

    key: str
    reason: str = field(metadata=NOT_SENT)

    def explain(self) -> str:
        return (
            f"guest profile {self.key} is unreadable ({self.reason}); rewrite it with `crashsafe guests set`"
        )


# How many times an operator's edit re-reads the record after another writer (the memory executor) came first.
MAX_CLASHES = 8


class GuestProfiles:
    """`<ns>_guests`, one record per guest (`guest.<tenant>.<digest>`). The runtime reads it at a run's start
    (when its agent's config has `memory`); the operator sets the verified address and the corporate fields;
    only the memory executor writes preferences (`remember_preference`), each write a compare-and-set."""

    def __init__(self, broker: Broker | None = None, ns: Namespace | None = None) -> None:
        # No broker: a runtime built without guest memory (tests of other parts); every guest is unknown.
        self.broker = broker
        self.ns = ns or Namespace()

    async def start(self) -> None:
        """Stop with StreamMissing (naming `crashsafe infra apply`) unless the bucket was provisioned."""
        if self.broker is not None:
            await self.broker.require_stream(guests_spec(self.ns).stream)

    async def read(self, tenant: str, guest_id: str) -> GuestProfile | None:
        """The guest's profile as a run is told it, or None for a guest nobody has set anything for. The keys
        that wrote it are the executor's bookkeeping, not the run's: they stay out of the journal."""
        stored = await self.stored(tenant, guest_id)
        if stored is None:
            return None
        return msgspec.structs.replace(stored[0], applied=[])

    async def stored(self, tenant: str, guest_id: str) -> tuple[GuestProfile, int] | None:
        """The record as it is in the bucket, and its revision."""
        if self.broker is None or not tenant or not guest_id:
            return None
        entry = await self.broker.kv_get(guests_spec(self.ns), self.ns.guest_key(tenant, guest_id))
        if entry is None:
            return None
        try:
            return profile_decoder.decode(entry.value), entry.revision
        except msgspec.DecodeError as exc:
            raise ProfileUnreadable(key=self.ns.guest_key(tenant, guest_id), reason=str(exc)) from None

    async def set_identity(
        self,
        tenant: str,
        guest_id: str,
        *,
        verified_email: str | None = None,
        corporate: bool | None = None,
        manager: str | None = None,
    ) -> GuestProfile:
        """The operator's edit: the fields given change, preferences and the keys that wrote them stay. A
        compare-and-set like the executor's, so an edit never loses a preference written at the same time."""
        if self.broker is None:
            raise BrokerUnavailable("guest profiles were built without a broker; an edit needs one")
        spec, key = guests_spec(self.ns), self.ns.guest_key(tenant, guest_id)
        revision = 0
        for _ in range(MAX_CLASHES):
            stored = await self.stored(tenant, guest_id)
            profile, revision = stored if stored is not None else (GuestProfile(guest_id=guest_id), 0)
            changes: dict[str, object] = {}
            if verified_email is not None:
                changes["verified_email"] = verified_email
            if corporate is not None:
                changes["corporate"] = corporate
            if manager is not None:
                changes["manager"] = manager
            updated = msgspec.structs.replace(profile, **changes, version=profile.version + 1)
            try:
                await self.broker.kv_write(spec, key, profile_encoder.encode(updated), revision=revision)
            except LeaseConflict:
                continue
            return updated
        # Every round lost to another writer: the operator's edit is retried later, never written blind.
        raise LeaseConflict(key=key, expected_revision=revision)
