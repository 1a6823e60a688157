"""What contracts/ declares about JetStream's layout, read by introspection: streams, durable consumers, KV buckets."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from crashsafe.contract_catalog import NS, REGISTRY
from crashsafe.contracts import streams as stream_contracts
from crashsafe.contracts.streams import ConsumerSpec, KvSpec, StreamSpec, stream_specs
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.domain.registry import Registry, load


def streams(ns: Namespace = NS) -> list[StreamSpec]:
    return stream_specs(ns)


def registry() -> Registry:
    return load(REGISTRY)


@dataclass(frozen=True, slots=True)
class Consumer:
    declared_by: str  # the crashsafe.contracts.streams function
    spec: ConsumerSpec
    doc: str


def _returns(func: Any, names: set[str]) -> bool:
    return str(inspect.signature(func).return_annotation) in names


def consumers(ns: Namespace = NS) -> list[Consumer]:
    """Every durable `crashsafe.contracts.streams` declares, one per family partition and projection tool of the reference
    deployment (a function's parameters other than the namespace come from the registry)."""
    reg = registry()
    values: dict[str, list[Any]] = {
        "family": sorted(reg.families),
        "partition": list(range(DEFAULT_ACTION_PARTITIONS)),
        "tool": sorted(reg.projections),
    }
    found = []
    for name, func in inspect.getmembers(stream_contracts, inspect.isfunction):
        if func.__module__ != stream_contracts.__name__ or not _returns(
            func, {"ConsumerSpec", "list[ConsumerSpec]"}
        ):
            continue
        required = [
            p.name
            for p in list(inspect.signature(func).parameters.values())[1:]
            if p.default is inspect.Parameter.empty
        ]
        combos: list[dict[str, Any]] = [{}]
        for p in required:
            combos = [c | {p: v} for c in combos for v in values[p]]
        doc = " ".join(inspect.cleandoc(func.__doc__ or "").split())
        for combo in combos:
            made = func(ns, **combo)
            for spec in made if isinstance(made, list) else [made]:
                found.append(Consumer(name, spec, doc))
    return found


def buckets(ns: Namespace = NS) -> list[tuple[KvSpec, str]]:
    """Every KV bucket `crashsafe.contracts.streams` declares (a `*_spec` function returning a KvSpec), with its docstring."""
    return [
        (func(ns), " ".join(inspect.cleandoc(func.__doc__ or "").split()))
        for name, func in inspect.getmembers(stream_contracts, inspect.isfunction)
        if func.__module__ == stream_contracts.__name__ and _returns(func, {"KvSpec"})
    ]
