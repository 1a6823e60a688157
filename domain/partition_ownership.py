"""Who should hold which partition, and what a replica does about it: pure decisions over a lease snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import msgspec


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `lease.<family>.<partition>`; its KV revision is the fencing token. `owner == ""`: released."""

    owner: str
    incarnation: str  # one process life of `owner`: a restarted replica knows its previous life's leases
    acquired_at: float  # wall clock, for operators; expiry is the server's TTL, never a client's clock
    renewed_at: float


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `holder.<family>.<partition>` (no TTL): the action store that last held the partition."""

    store: str  # the store's id (a SQLite file's own uuid)
    owner: str
    token: int  # the lease revision it held
    epoch: int = 0  # the partition epoch it held under (0: written by 0.2.0, which counts none)


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `member.<family>.<worker>`: one live replica, renewed with a TTL."""

    worker: str
    incarnation: str


class PartitionEpoch(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `fact.<family>.epoch-<partition>` in the key-facts bucket: the partition's latest epoch, counted
    up by compare-and-set at each acquisition. It lives beside the facts it orders, not in the leases bucket, so a
    leases bucket made again (its revisions, the lease tokens, starting at 1 again) cannot take the order back."""

    epoch: int
    owner: str
    token: int  # the lease revision the acquisition wrote (for an operator reading an incident)


lease_encoder = msgspec.json.Encoder()
lease_decoder = msgspec.json.Decoder(Lease)
holder_decoder = msgspec.json.Decoder(Holder)
member_decoder = msgspec.json.Decoder(Member)
epoch_decoder = msgspec.json.Decoder(PartitionEpoch)


def assign(members: Iterable[str], partitions: int) -> dict[str, frozenset[int]]:
    """Partitions dealt round-robin over the sorted live members: balanced within one, the same on every replica
    that sees the same members."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    dealt: dict[str, set[int]] = {m: set() for m in ordered}
    for p in range(partitions):
        dealt[ordered[p % len(ordered)]].add(p)
    return {m: frozenset(ps) for m, ps in dealt.items()}


def desired(
    me: str, members: Iterable[str], partitions: int, static: tuple[int, ...] | None
) -> frozenset[int]:
    """The partitions `me` should hold: an explicit list is taken as it is; otherwise its share of the live members
    (itself always counted, so a replica that cannot see its own member key yet still takes a share)."""
    if static is not None:
        return frozenset(static)
    return assign([*members, me], partitions)[me]


@dataclass(frozen=True, slots=True)
class Slot:
    """One partition's lease as last read: its revision (0 = no such key) and value (None = absent)."""

    revision: int
    lease: Lease | None


@dataclass(frozen=True, slots=True)
class Acquire:
    partition: int
    revision: int  # the revision the write must find (0: the key must not exist)


@dataclass(frozen=True, slots=True)
class Renew:
    partition: int


@dataclass(frozen=True, slots=True)
class Release:
    partition: int


Move = Acquire | Renew | Release


def free(slot: Slot | None, me: str, incarnation: str) -> bool:
    """A lease anyone may take: absent (never held, or expired by its TTL), released, or left by my previous life."""
    if slot is None or slot.lease is None or slot.lease.owner == "":
        return True
    return slot.lease.owner == me and slot.lease.incarnation != incarnation


def plan(
    me: str,
    incarnation: str,
    want: frozenset[int],
    held: Iterable[int],
    slots: Mapping[int, Slot],
) -> list[Move]:
    """Renew what I hold and want, release what I hold and should not, take what I want and nobody holds.

    A wanted partition another live replica still holds is left alone: it releases it once it sees the same
    members, or its lease expires. Releases come first so a shrinking replica frees partitions promptly."""
    mine = set(held)
    moves: list[Move] = [Release(p) for p in sorted(mine - want)]
    moves += [Renew(p) for p in sorted(mine & want)]
    for p in sorted(want - mine):
        slot = slots.get(p)
        if free(slot, me, incarnation):
            moves.append(Acquire(p, slot.revision if slot is not None else 0))
    return moves


class Holding(NamedTuple):
    """A holder's place in a partition's fencing order, compared as a tuple: the epoch of its acquisition first,
    then its lease revision (which only orders one acquisition's renewals). (0, 0): not held, below everything."""

    epoch: int
    token: int


def next_epoch(stored: PartitionEpoch | None, now: float) -> int:
    """The epoch of an acquisition: above the partition's last one whatever the clocks say (compare-and-set keeps
    two acquisitions from taking the same), and no lower than the wall clock in milliseconds, so it stays above
    the epochs live holders carry even if the key-facts bucket itself is made again."""
    return max((stored.epoch if stored is not None else 0) + 1, int(now * 1000))


@dataclass(frozen=True, slots=True)
class Tenure:
    """A lease this replica holds: its fencing token and epoch, and until when (local monotonic clock) it may act
    on it."""

    partition: int
    token: int
    valid_until: float
    epoch: int

    @property
    def holding(self) -> Holding:
        return Holding(self.epoch, self.token)


def tenure_after_write(
    partition: int, holding: Holding, written_at: float, lease_s: float, margin_s: float
) -> Tenure:
    """A lease written at monotonic time `written_at` (taken before the write was sent) expires on the server no
    sooner than `lease_s` later; act on it only until `margin_s` before that."""
    return Tenure(
        partition=partition,
        token=holding.token,
        valid_until=written_at + lease_s - margin_s,
        epoch=holding.epoch,
    )


def fenced(tenure: Tenure | None, now: float) -> str | None:
    """Why this replica may not write for the partition now, or None if it may."""
    if tenure is None:
        return "not held"
    if now >= tenure.valid_until:
        return "lease not renewed in time"
    return None


def takeover(holder: Holder | None, store_id: str) -> bool:
    """Whether a newly acquired partition was last held by another store, which may know keys this one does not.

    No holder record: nobody has held the partition under leases, so this store is its first (see decisions.md
    for what that means when upgrading)."""
    return holder is not None and holder.store != store_id


def inherited(requested_at: float, takeover_at: float | None, skew_s: float) -> bool:
    """A key with no record here, asked before this store took the partition over (give or take the hosts' clock
    skew), may have been acted on by the previous holder: look it up by key before calling."""
    return takeover_at is not None and requested_at < takeover_at + skew_s
