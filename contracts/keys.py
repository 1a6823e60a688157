"""Deterministic identities: run ids from inbound keys, action keys from steps, input hashes, key partitions."""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Any

import msgspec

_canonical = msgspec.json.Encoder(order="sorted")


RUN_ID = re.compile(r"^run_[0-9a-f]{24}$")


def is_run_id(value: str) -> bool:
    """Run ids come from `run_id_for`; anything else (a wildcard, a quote) is refused before it nears a subject."""
    return bool(RUN_ID.match(value))


def input_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON (sorted keys) of a value: equal inputs hash equal in any language."""
    return hashlib.sha256(_canonical.encode(value)).hexdigest()


def tool_input_hash(tool: str, args: dict[str, Any]) -> str:
    """What an action's key is bound to (`ActionRequested.input_hash`): the tool and its exact arguments."""
    return input_hash({"tool": tool, "args": args})


def inbound_hash(message: Any, agent: str) -> str:
    """What an inbound key is bound to: the guest message and the agent asked to handle it."""
    return input_hash({"agent": agent, "message": message})


def run_id_for(tenant: str, inbound_key: str) -> str:
    """The run a guest event lands on: derived from (tenant, the event's id), so a redelivery after any dedup
    window finds the same run and two tenants' event ids never meet. A tenant never holds `/` (TENANT)."""
    return "run_" + hashlib.sha256(f"inbound:{tenant}/{inbound_key}".encode()).hexdigest()[:24]


def action_key(run_id: str, step_no: int) -> str:
    """The idempotency key of a run's step: the same on every retry, redelivery and restart."""
    return f"{run_id}:{step_no}"


class KeyScheme(StrEnum):
    """How a run keys its actions (`RunStarted.key_scheme`, pinned for the run's life so a replay decides the
    keys its journal holds; `str` on the wire: open)."""

    STEP = ""  # every action `run_id:step_no`: the journals written before business keys
    BUSINESS = "business"  # each tool by its KeyRule: business identity where it has one (tools.KeyRule)


class GuestScope(StrEnum):
    """Who a run's guest is at the providers (`RunStarted.guest_scope`, pinned for the run's life so a replay
    decides the arguments its journal holds; `str` on the wire: open)."""

    GUEST = ""  # the guest id alone, in the providers' one account: the journals written before tenancy
    TENANT = "tenant"  # (tenant, guest): every call acts in the tenant's own provider account


# The argument naming the provider account an action acts in; the executor sends it as `Provider-Account`.
ACCOUNT_ARG = "account"


def provider_account(tenant: str, scope: str) -> str:
    """The provider account a run of `tenant` acts in: the tenant's own, computed here and nowhere else (never
    by a model). "": the providers' default account, for a run journaled before tenants had their own."""
    return tenant if scope == GuestScope.TENANT else ""


def business_key(kind: str, tenant: str, values: dict[str, Any], attempt: int = 1) -> str:
    """The idempotency key of a business action: what it is (`kind`: hold, charge, ...), for whom (`tenant`) and
    on what (`values`: the contract's identity fields from the prepared arguments). The same intent asked in
    another step, a resumed run or another run of the tenant is the same key, so the executor's store answers
    it with its receipt instead of acting twice. `attempt` > 1 names a deliberate new attempt at the same
    intent (a hold asked again after it was released, a charge retried with approval after a decline):
    `hold:<digest>:a2`. The digest is SHA-256 over the canonical JSON, so equal identities key equal anywhere."""
    if attempt < 1:
        raise ValueError("attempts count from 1")
    digest = input_hash({"kind": kind, "tenant": tenant, "identity": values})
    base = f"{kind}:{digest}"
    return base if attempt == 1 else f"{base}:a{attempt}"


def key_attempt(key: str) -> int:
    """Which attempt a business key names (1 for a key with no `:aN` suffix, and for any non-business key)."""
    head, sep, tail = key.rpartition(":a")
    return int(tail) if sep and head and tail.isdigit() and ":" in head else 1


class CompensationKind(StrEnum):
    """What undoing an effect does; the last token of a compensation's key (`run_…:4:release`)."""

    RELEASE = "release"  # give back a hold (a reserved room, seat, desk)
    REFUND = "refund"  # pay back a charge


def compensation_key(original_key: str, kind: CompensationKind) -> str:
    """The key of a compensating action bound to the action it undoes: deciding it twice names one effect."""
    return f"{original_key}:{kind}"  # StrEnum formats as its value


def undone_by(key: str) -> str | None:
    """The key a compensation key undoes (`hold:<d>:release` -> `hold:<d>`), or None for any other key."""
    base, sep, kind = key.rpartition(":")
    return base if sep and base and kind in set(CompensationKind) else None


def partition_key(key: str) -> str:
    """What a key is partitioned by: itself, except that the compensation of a business key goes with the key it
    undoes, so one executor's store holds both and can tell a replay that the effect was undone. Step keys
    (`run_…`) and their compensations keep partitioning by the whole key, as they always did."""
    if key.startswith("run_"):
        return key
    return undone_by(key) or key


def partition_of(key: str, partitions: int) -> int:
    """First 4 bytes of SHA-256(partition_key(key)), big-endian, modulo the partition count: stable across
    languages."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return int.from_bytes(hashlib.sha256(partition_key(key).encode()).digest()[:4], "big") % partitions
