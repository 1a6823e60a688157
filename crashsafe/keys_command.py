"""`crashsafe keys create|list|revoke` and `crashsafe capability-key new`: the keys, as an operator sees them."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from crashsafe.contracts.clients import Scope
from crashsafe.deployment import settings_for
from crashsafe.services.operations.api_keys import all_keys, mint_key, revoke_key
from crashsafe.services.operations.connection import operator_broker


async def keys_create(
    state_dir: Path, tenant: str, scopes: list[str], name: str, agents: list[str] | None = None
) -> int:
    """Mint a key; the key is printed once, here, and stored only as the hash of its secret. `agents`: what it
    may start (`*`: every agent); none, the default agent only."""
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-keys") as broker:
        minted = await mint_key(
            broker,
            settings.namespace,
            settings.stream_replicas,
            tenant,
            [Scope(s) for s in scopes],
            name,
            agents,
        )
    record = minted.record
    print(minted.key)
    print(
        f"key {record.key_id} for tenant {record.tenant}, scopes {', '.join(record.scopes)}, agents"
        f" {', '.join(record.agents) if record.agents else 'the default agent only'}: shown once, keep it"
        " secret (only a hash of it is stored)",
        file=sys.stderr,
    )
    return 0


async def keys_list(state_dir: Path) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-keys") as broker:
        records = await all_keys(broker, settings.namespace)
    for r in records:
        state = f"revoked {r.revoked_at:%Y-%m-%d %H:%M:%S}" if r.revoked_at else "active"
        print(
            f"{r.key_id}  tenant {r.tenant}  scopes {','.join(r.scopes)}  "
            f"agents {','.join(r.agents) if r.agents else '(default)'}  {state}  "
            f"created {r.created_at:%Y-%m-%d %H:%M:%S}  {r.name}".rstrip()
        )
    if not records:
        print("no keys")
    return 0


async def keys_revoke(state_dir: Path, key_id: str) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-keys") as broker:
        revoked = await revoke_key(broker, settings.namespace, key_id)
    if revoked is None:
        print(f"crashsafe: no key {key_id} in namespace {settings.namespace.name}", file=sys.stderr)
        return 1
    print(f"key {key_id} revoked: every gateway refuses it from its next request")
    return 0


def capability_key_new(out: Path) -> int:
    """`crashsafe capability-key new --out PATH`: a key pair for a rotation (docs/security.md#capabilities)."""
    from crashsafe.services.records.capability_keys import public_path, write_key_pair

    if out.exists():
        sys.exit(f"crashsafe: {out} exists; a key is never overwritten: choose another path")
    kid = write_key_pair(out)
    Console().print(f"key id {kid}\nprivate {out} (0600: the runtime's CRASHSAFE_CAPABILITY_SIGNING_KEY)")
    Console().print(f"public  {public_path(out)} (the executors' CRASHSAFE_CAPABILITY_VERIFY_KEYS)")
    return 0
