"""`crashsafe config show|validate|publish`: the configuration catalog, as the operator sees and changes it.

The catalog's store (read, publish, the stored revisions) is the runtime's, which reads it for every run's start
(services/records/run_catalog.py); this command prints and checks what it holds."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from crashsafe.contracts.catalog import Catalog
from crashsafe.contracts.errors import InvalidCatalog
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.records.run_catalog import publish_catalog, read_catalog, stored_catalog

_pretty = msgspec.json.Encoder(order="sorted")


def _read_file(path: Path, registry: registries.Registry) -> Catalog:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidCatalog([f"cannot read {path}: {exc.strerror}"]) from exc
    return read_catalog(raw, registry)


def _refused(exc: InvalidCatalog) -> int:
    print(f"crashsafe: the catalog is invalid ({len(exc.problems)} problems):", file=sys.stderr)
    for problem in exc.problems:
        print(f"  - {problem}", file=sys.stderr)
    return 1


def validate(state_dir: Path, path: Path) -> int:
    """Check FILE against this deployment's agents and tools; no broker needed."""
    registry = registries.load(settings_for(state_dir).registry)
    try:
        catalog = _read_file(path, registry)
    except InvalidCatalog as exc:
        return _refused(exc)
    print(f"valid: {len(catalog.agents)} agent(s): {', '.join(sorted(catalog.agents))}")
    return 0


async def show(state_dir: Path, revision: int | None) -> int:
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    async with operator_broker(settings, "crashsafe-config") as broker:
        number, catalog = await stored_catalog(broker, settings.namespace, registry, revision)
    print(f"revision {number}{f' ({catalog.label})' if catalog.label else ''}", file=sys.stderr)
    print(msgspec.json.format(_pretty.encode(catalog), indent=2).decode())
    return 0


async def publish(state_dir: Path, path: Path, label: str | None) -> int:
    """Validate FILE, then publish it as the next revision (new runs take it; running ones keep theirs)."""
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    try:
        catalog = _read_file(path, registry)
    except InvalidCatalog as exc:
        return _refused(exc)
    if label is not None:
        catalog = msgspec.structs.replace(catalog, label=label)
    async with operator_broker(settings, "crashsafe-config") as broker:
        try:
            revision = await publish_catalog(broker, settings.namespace, registry, catalog)
        except InvalidCatalog as exc:
            return _refused(exc)
    print(revision)
    print(
        f"published catalog revision {revision}: new runs take it, running ones keep the revision they started with",
        file=sys.stderr,
    )
    return 0
