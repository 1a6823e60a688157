"""The contract lock (contracts/lock.json): every message's fields with their types, and what may change.

A field is only ever added, with a default; never removed or retyped; a required field is never added. A breaking
change is a new message type (a new tag) plus an upcaster. `just docs` extends the lock with additive changes and
refuses to write a breaking one; tests/unit/test_schema_evolution.py fails on one. Both check the previous
release's lock too, as it shipped (contracts/releases/<version>.json, `crashsafe.release_snapshot`), so a lock
rewritten by hand hides no break. What lives on the broker (streams, consumers, buckets, subjects, headers) has its
own lock and rules: `crashsafe.wire_lock`.
"""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi

from crashsafe.contract_catalog import default_of, messages, render_type

Lock = dict[str, dict[str, dict[str, Any]]]


def entry_of(field: mi.Field) -> dict[str, Any]:
    """One field as the lock holds it: its type, whether it is required, and its default (as JSON) if it has one:
    every old message without the field, and every `omit_defaults` one that held the default, reads as it."""
    default = default_of(field)
    entry: dict[str, Any] = {"type": render_type(field.type), "required": default is None}
    if default is not None:
        entry["default"] = default
    return entry


def current() -> Lock:
    """Today's contracts as a lock: message name -> field (wire name) -> {type, required, default}."""
    return {m.name: {f.encode_name: entry_of(f) for f in m.info.fields} for m in messages()}


def breaking_changes(locked: Lock, now: Lock) -> list[str]:
    """What `now` breaks of `locked`, one sentence each (empty: compatible, possibly extended)."""
    problems = []
    for name, fields in sorted(locked.items()):
        if name not in now:
            problems.append(f"{name}: the message type was removed (a type is kept forever)")
            continue
        for field, was in sorted(fields.items()):
            then = now[name].get(field)
            if then is None:
                problems.append(f"{name}.{field}: removed (fields are never removed)")
            elif then["type"] != was["type"]:
                problems.append(f"{name}.{field}: type changed from {was['type']} to {then['type']}")
            elif then["required"] and not was["required"]:
                problems.append(f"{name}.{field}: was optional, now required (it lost its default)")
            elif "default" in was and "default" in then and then["default"] != was["default"]:
                problems.append(
                    f"{name}.{field}: default changed from {was['default']} to {then['default']} (an old "
                    "message without the field would read otherwise)"
                )
        for field, then in sorted(now[name].items()):
            if field not in fields and then["required"]:
                problems.append(f"{name}.{field}: a new field without a default (old messages lack it)")
    return problems


def merged(locked: Lock, now: Lock) -> Lock:
    """The lock after an additive change: new types and fields in; required-to-optional loosened."""
    return {name: dict(sorted(fields.items())) for name, fields in sorted({**locked, **now}.items())}
