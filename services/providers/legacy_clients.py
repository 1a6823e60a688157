"""A 0.2 provider client (`call(args, key, deadline)`, `lookup(key, args)`, the account among its arguments) served
behind the 0.3 protocol until 0.4, with a deprecation warning when it is opened: delete this module in 0.4."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, cast

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.domain.registry import (
    LegacyProviderClient,
    ListingClient,
    ProviderAnswer,
    ProviderCall,
    ProviderClient,
)


def legacy(client: object) -> bool:
    """Whether a client has the 0.2 shape: a `call` of three arguments (args, key, deadline), not one (call)."""
    try:
        parameters = inspect.signature(client.call).parameters.values()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 3


def served(tool: str, client: ProviderClient | LegacyProviderClient) -> ProviderClient:
    """The client as the executor calls it: a 0.3 one as it is, a 0.2 one behind `Legacy`, warned about."""
    if not legacy(client):
        return cast(ProviderClient, client)
    warnings.warn(
        f"tool {tool!r}: its provider client has the 0.2 shape (call(args, key, deadline), lookup(key, args)),"
        " served until 0.4: write call(self, call: ProviderCall) and lookup(self, call: ProviderCall), and send"
        " call.account as the provider's account (docs/providers.md)",
        DeprecationWarning,
        stacklevel=2,
    )
    return Legacy(cast(LegacyProviderClient, client))


class Legacy:
    """A 0.2 client behind the 0.3 protocol: its arguments carry the account under `ACCOUNT_ARG`, as it was written
    to read them there (and to keep it out of the provider's body itself)."""

    def __init__(self, client: LegacyProviderClient) -> None:
        self.client = client

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        return await self.client.call(_with_account(call), call.key, call.deadline)

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        return await self.client.lookup(call.key, _with_account(call))

    async def effects(self) -> list[ProviderEffect]:
        return await cast(ListingClient, self.client).effects()  # AttributeError: it lists nothing


def _with_account(call: ProviderCall) -> dict[str, Any]:
    return {**call.args, ACCOUNT_ARG: call.account} if call.account else dict(call.args)
