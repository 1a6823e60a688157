"""API keys, as the operator mints, lists and revokes them (`crashsafe keys`): the gateway only reads them."""

from __future__ import annotations

from crashsafe.contracts.clients import ApiKeyRecord, Scope
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys, MintedKey


async def mint_key(
    broker: Broker,
    ns: Namespace,
    replicas: int,
    tenant: str,
    scopes: list[Scope],
    name: str,
    agents: list[str] | None = None,
) -> MintedKey:
    """A new key (its bucket declared first, on a fresh deployment): the secret is in the answer only, the store
    keeps its hash. `agents`: what it may start (`*`: every agent); None, the default agent only."""
    keys = ClientKeys(broker, ns, replicas)
    await keys.ensure()
    return await keys.create(tenant, scopes, name, agents)


async def all_keys(broker: Broker, ns: Namespace) -> list[ApiKeyRecord]:
    """Every key's record (never a secret), oldest first."""
    return sorted(await ClientKeys(broker, ns).all(), key=lambda r: r.created_at)


async def revoke_key(broker: Broker, ns: Namespace, key_id: str) -> ApiKeyRecord | None:
    """The key refused from every gateway's next request on; None if there is no such key."""
    return await ClientKeys(broker, ns).revoke(key_id)
