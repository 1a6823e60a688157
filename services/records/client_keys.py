"""API client keys in the `{ns}_clients` bucket: minted and revoked by the operator, read by every gateway."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from crashsafe.contracts.clients import (
    EXCLUSIVE_SCOPES,
    SECRET_BYTES,
    ApiKeyRecord,
    Scope,
    api_key_decoder,
    api_key_encoder,
    format_key,
    is_tenant,
    secret_hash,
    split_key,
)
from crashsafe.contracts.errors import BrokerUnavailable, InvalidRequest
from crashsafe.contracts.streams import clients_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess

MINT_ATTEMPTS = 60  # 15 s at 0.25 s


@dataclass(frozen=True, slots=True)
class MintedKey:
    """A new key: `key` is shown to the operator once and exists nowhere else."""

    key: str
    record: ApiKeyRecord


class ClientKeys:
    """The bucket of one namespace (a thin adapter: every rule about a key lives in domain/access.py)."""

    def __init__(self, broker: Broker, ns: Namespace, replicas: int = 1) -> None:
        self.broker = broker
        self.ns = ns
        self.spec = clients_spec(ns, replicas)

    async def ensure(self) -> None:
        await self.broker.ensure_kv(self.spec)

    async def get(self, key_id: str) -> ApiKeyRecord | None:
        """The record as stored now: a direct get of the key's last value, so a revocation is seen at once."""
        entry = await self.broker.kv_get(self.spec, self.ns.client_key(key_id))
        if entry is None or not entry.value:
            return None
        try:
            return api_key_decoder.decode(entry.value)
        except msgspec.DecodeError:
            return None  # a record this version cannot read authenticates nobody

    async def create(
        self, tenant: str, scopes: list[Scope], name: str = "", agents: list[str] | None = None
    ) -> MintedKey:
        """`agents`: what the key may start (`*`: every agent); none named, the deployment's default agent only."""
        if not is_tenant(tenant):
            raise InvalidRequest(
                f"tenant {tenant[:64]!r} must be lower-case letters, digits, _ and -, starting with a letter or digit"
            )
        if not scopes:
            raise InvalidRequest("a key needs at least one scope: " + ", ".join(s.value for s in Scope))
        if {s.value for s in scopes} >= EXCLUSIVE_SCOPES:
            raise InvalidRequest(
                "a key may not both start runs (events:write) and approve what they hold (approvals:decide):"
                " mint the manager's key separately"
            )
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(SECRET_BYTES)
        record = ApiKeyRecord(
            key_id=key_id,
            tenant=tenant,
            scopes=sorted({s.value for s in scopes}),
            secret_sha256=secret_hash(secret),
            name=name,
            created_at=datetime.now(UTC),
            agents=sorted(set(agents)) if agents else None,
        )
        await self.broker.kv_write(
            self.spec, self.ns.client_key(key_id), api_key_encoder.encode(record), revision=0
        )
        return MintedKey(format_key(key_id, secret), record)

    async def all(self) -> list[ApiKeyRecord]:
        entries = await self.broker.kv_scan(self.spec, self.ns.clients_all)
        return [api_key_decoder.decode(e.value) for e in entries if e.value]

    async def revoke(self, key_id: str) -> ApiKeyRecord | None:
        """Mark the key revoked (the record stays, for the audit trail); None if there is no such key."""
        entry = await self.broker.kv_get(self.spec, self.ns.client_key(key_id))
        if entry is None or not entry.value:
            return None
        record = api_key_decoder.decode(entry.value)
        if record.revoked_at is not None:
            return record
        revoked = msgspec.structs.replace(record, revoked_at=datetime.now(UTC))
        await self.broker.kv_write(
            self.spec, self.ns.client_key(key_id), api_key_encoder.encode(revoked), revision=entry.revision
        )
        return revoked


async def replace_stack_key(
    nats_url: str,
    namespace: str,
    tenant: str,
    previous: str | None,
    replicas: int = 1,
    access: NatsAccess | None = None,
    scopes: tuple[Scope, ...] = (Scope.ADMIN,),
    name: str = "crashsafe up",
) -> str:
    """`crashsafe up`'s own admin key (or, with `scopes`, another of its keys: the synthetic turn's), minted as
    the operator: a new one, and the one a previous start left behind revoked."""
    broker = await Broker.connect(nats_url, "crashsafe-up", fail_fast=True, access=access)
    try:
        keys = ClientKeys(broker, Namespace(namespace), replicas)
        await keys.ensure()
        # A bucket just created on a cluster answers once its replicas have elected a leader (a second or so).
        for attempt in range(MINT_ATTEMPTS):
            try:
                minted = await keys.create(tenant, list(scopes), name=name)
                break
            except BrokerUnavailable:
                if attempt == MINT_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.25)
        old = split_key(previous) if previous else None
        if old is not None:
            await keys.revoke(old[0])
        return minted.key
    finally:
        await broker.close()
