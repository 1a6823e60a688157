"""The sandbox's listing of every effect it holds, as the audit's `ProviderListing` port asks for it."""

from __future__ import annotations

from typing import Protocol

import aiohttp
import httpx
import msgspec

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.sandbox.records import LedgerView

LEDGER_PATH = "/_ledger"
_view = msgspec.json.Decoder(LedgerView)
# Either client's failures (an httpx client's; a provider's aiohttp session's), or a body that is not a ledger
# (msgspec's ValidationError is a DecodeError).
_UNREADABLE = (httpx.HTTPError, aiohttp.ClientError, TimeoutError, msgspec.DecodeError)


class LedgerAnswer(Protocol):
    """An HTTP answer as the listing reads it (httpx's `Response`, a provider's `ProviderResponse`)."""

    @property
    def content(self) -> bytes: ...

    def raise_for_status(self) -> object: ...


class LedgerClient(Protocol):
    """An HTTP client at the sandbox's base URL: an `httpx.AsyncClient`, or a provider's (`Providers.http`)."""

    async def get(self, url: str, /, *, params: dict[str, str] | None = None) -> LedgerAnswer: ...


class SandboxListing:
    """Reads `GET /_ledger`: what a real provider's list API would give (Stripe's charges, a PMS's bookings)."""

    def __init__(self, http: LedgerClient) -> None:
        self.http = http

    async def view(self, guest_id: str | None = None) -> LedgerView:
        response = await self.http.get(LEDGER_PATH, params={"guest_id": guest_id} if guest_id else None)
        response.raise_for_status()
        return _view.decode(response.content)

    async def effects(self) -> list[ProviderEffect]:
        return [ProviderEffect(kind=e.kind.value, key=e.key, ref=e.ref) for e in (await self.view()).entries]

    async def listed(self) -> ListedEffects | None:
        """The listing, read once; None if the providers are not the sandbox (an adopter's own, a staging API):
        no `/_ledger`, or one in another format. The audit then checks effects by key alone."""
        try:
            return ListedEffects(await self.effects())
        except _UNREADABLE:
            return None


class ListedEffects:
    """A listing already read: the audit's `ProviderListing` port over a list in hand."""

    def __init__(self, effects: list[ProviderEffect]) -> None:
        self._effects = effects

    async def effects(self) -> list[ProviderEffect]:
        return self._effects
