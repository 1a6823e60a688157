"""`Chain`: an immutable sequence that grows by one in O(1), so folding a journal of n turns costs O(n), not O(n²)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T", bound=Hashable)


class _Store(Generic[T]):
    """The items of every chain grown from the same first one, and where each item first stands."""

    __slots__ = ("items", "index")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.index: dict[T, int] = {}
        for at, item in enumerate(items):
            self.index.setdefault(item, at)


class Chain(Sequence[T]):
    """A value: what a chain holds never changes. `add` shares the storage with the chain it grew from while that
    one is the longest grown from it (a fold's usual case: each state grows its predecessor once), and copies
    only when an older chain grows a second way. Membership is a dict look-up, not a scan.

    A tuple's `t + (x,)` copies all of `t`, and `x in t` compares with every item: a run waiting for a manager
    while its guest sent 16,000 messages folded in seconds, each message re-folding the whole journal."""

    __slots__ = ("_store", "_n")

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._store: _Store[T] = _Store(list(items))
        self._n = len(self._store.items)

    def add(self, item: T) -> Chain[T]:
        """This chain and `item` after it."""
        store = self._store
        if self._n != len(store.items):  # an older chain growing a second way: it gets storage of its own
            store = _Store(store.items[: self._n])
        store.items.append(item)
        store.index.setdefault(item, self._n)
        grown: Chain[T] = Chain.__new__(Chain)
        grown._store, grown._n = store, self._n + 1
        return grown

    def __contains__(self, item: object) -> bool:
        try:
            return self._store.index.get(item, self._n) < self._n  # type: ignore[arg-type]
        except TypeError:  # unhashable: it cannot be here
            return False

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[T]:
        items = self._store.items
        return (items[i] for i in range(self._n))

    @overload
    def __getitem__(self, at: int) -> T: ...
    @overload
    def __getitem__(self, at: slice) -> tuple[T, ...]: ...
    def __getitem__(self, at: int | slice) -> T | tuple[T, ...]:
        if isinstance(at, slice):
            return tuple(self._store.items[: self._n][at])
        if not -self._n <= at < self._n:
            raise IndexError("chain index out of range")
        return self._store.items[at % self._n]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chain | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Chain({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Chain, (list(self),))
