"""Python's garbage collector set for services that handle many short-lived messages: the objects of a start are
frozen out of every collection, and the youngest generation is collected after 50,000 allocations, not 700."""

from __future__ import annotations

import gc

# A message's objects are freed by reference counting as its handler returns; the cyclic collector only has to
# find the rare cycle. At CPython's 700 it ran every few messages, scanning what each handler still held: steps5,
# runtime CPU per run 2.97 → 2.76 ms, throughput 212 → 224 runs/s through the gateway (docs/benchmarks.md).
YOUNGEST = 50_000
OLDER = 10  # CPython's own for the two older generations


def settle() -> None:
    """Collect what starting made, freeze the rest (modules, settings, the registry: never garbage, and with a
    fork server shared copy-on-write, so a collection must not write to them), and raise the youngest threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNGEST, OLDER, OLDER)
