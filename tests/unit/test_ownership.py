"""Partition ownership decided purely: who should hold what, what a replica does about a lease snapshot, the fence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crashsafe.domain.partition_ownership import (
    Acquire,
    Holder,
    Holding,
    Lease,
    PartitionEpoch,
    Release,
    Renew,
    Slot,
    Tenure,
    assign,
    desired,
    fenced,
    inherited,
    next_epoch,
    plan,
    takeover,
    tenure_after_write,
)


def lease(owner: str, incarnation: str = "life-1") -> Lease:
    return Lease(owner=owner, incarnation=incarnation, acquired_at=0.0, renewed_at=0.0)


@given(st.sets(st.text("abcdefgh-", min_size=1, max_size=6), min_size=1, max_size=9), st.integers(1, 64))
def test_every_partition_has_exactly_one_desired_owner_and_shares_differ_by_at_most_one(
    members: set[str], partitions: int
) -> None:
    dealt = assign(members, partitions)
    owned = [p for share in dealt.values() for p in share]
    assert sorted(owned) == list(range(partitions))
    sizes = [len(share) for share in dealt.values()]
    assert max(sizes) - min(sizes) <= 1


def test_the_assignment_depends_on_the_members_not_on_the_order_a_replica_saw_them() -> None:
    assert assign(["b", "a", "c"], 4) == assign(["c", "a", "b", "a"], 4)
    assert assign(["a", "b"], 4) == {"a": frozenset({0, 2}), "b": frozenset({1, 3})}
    assert assign([], 4) == {}


def test_a_replica_always_counts_itself_and_an_explicit_list_is_taken_as_it_is() -> None:
    assert desired("a", [], 4, None) == frozenset({0, 1, 2, 3})
    assert desired("b", ["a"], 4, None) == frozenset({1, 3})
    assert desired("b", ["a", "b", "c"], 4, static=(0, 2)) == frozenset({0, 2})


def test_a_replica_renews_what_it_keeps_releases_what_it_should_not_hold_and_takes_only_what_is_free() -> (
    None
):
    slots = {
        0: Slot(10, lease("me")),
        1: Slot(11, lease("me")),
        2: Slot(12, lease("other")),  # wanted, but a live replica holds it: wait for it to let go
        3: Slot(13, lease("")),  # released
    }
    moves = plan("me", "life-1", frozenset({0, 2, 3, 5}), held={0, 1}, slots=slots)
    assert moves == [Release(1), Renew(0), Acquire(3, 13), Acquire(5, 0)]


def test_a_restarted_replica_takes_its_previous_lifes_leases_at_once_but_never_its_own_live_ones() -> None:
    slots = {0: Slot(7, lease("me", "life-1")), 1: Slot(8, lease("me", "life-2"))}
    # life-2 is this process; life-1 died (SIGKILL) with its lease still on the server.
    assert plan("me", "life-2", frozenset({0}), held=set(), slots=slots) == [Acquire(0, 7)]
    assert plan("me", "life-2", frozenset({1}), held=set(), slots=slots) == []


def test_the_fence_holds_until_a_margin_before_the_server_could_expire_the_lease() -> None:
    tenure = tenure_after_write(3, Holding(7, 42), written_at=100.0, lease_s=5.0, margin_s=1.0)
    assert tenure == Tenure(partition=3, token=42, valid_until=104.0, epoch=7)
    assert tenure.holding == Holding(7, 42)
    assert fenced(tenure, 103.9) is None
    assert fenced(tenure, 104.0) == "lease not renewed in time"  # e.g. resumed after SIGSTOP
    assert fenced(None, 0.0) == "not held"


def test_only_a_partition_last_held_by_another_store_is_a_takeover() -> None:
    assert not takeover(None, "mine")  # nobody held it under leases: this store is its first
    assert not takeover(Holder(store="mine", owner="pod-0", token=3), "mine")  # my own store, a restart
    assert takeover(Holder(store="theirs", owner="pod-1", token=9), "mine")


def test_after_a_takeover_keys_asked_before_it_plus_the_clock_skew_are_looked_up_first() -> None:
    assert not inherited(requested_at=50.0, takeover_at=None, skew_s=2.0)
    assert inherited(requested_at=50.0, takeover_at=100.0, skew_s=2.0)
    assert inherited(requested_at=101.9, takeover_at=100.0, skew_s=2.0)
    assert not inherited(requested_at=102.0, takeover_at=100.0, skew_s=2.0)


def test_an_epoch_is_above_the_last_one_whatever_the_clock_and_no_lower_than_the_clock() -> None:
    """Above the stored one even with a clock gone back (the compare-and-set counts); no lower than the wall clock
    in milliseconds, so a key-facts bucket made again still counts above the epochs its live holders carry."""
    last = PartitionEpoch(epoch=1_900_000_000_000, owner="pod-0", token=3)
    assert next_epoch(last, now=1_800_000_000.0) == 1_900_000_000_001
    assert next_epoch(None, now=1_800_000_000.5) == 1_800_000_000_500
    assert (
        next_epoch(PartitionEpoch(epoch=5, owner="pod-0", token=3), now=1_800_000_000.0) == 1_800_000_000_000
    )
    assert Holding(2, 1) > Holding(1, 90_000) > Holding(0, 10**9) > Holding(0, 0)
