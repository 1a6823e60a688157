"""The runtime's view of the configuration catalog: the current revision for new runs, any pinned one by number."""

from __future__ import annotations

import logging

import msgspec

from crashsafe.contracts.catalog import AgentConfig, Catalog, catalog_decoder, catalog_encoder
from crashsafe.contracts.errors import CatalogRevisionGone, InvalidCatalog
from crashsafe.contracts.streams import KvSpec, catalog_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.catalog_check import builtin_catalog, validate_catalog
from crashsafe.domain.registry import Registry
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker, KvEntry
from crashsafe.services.platform.logs import log

# Revisions kept in memory besides the built-in and the current one; older ones are read again by revision.
CACHED_REVISIONS = 16


def read_catalog(raw: bytes, registry: Registry, revision: int | None = None) -> Catalog:
    """A stored or submitted catalog, decoded and validated; `InvalidCatalog` lists every problem."""
    try:
        catalog = catalog_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidCatalog([f"not a catalog: {exc}"], revision=revision) from exc
    problems = validate_catalog(catalog, registry)
    if problems:
        raise InvalidCatalog(problems, revision=revision)
    return catalog


class RunCatalog:
    """Revision 0 is the deployment's built-in catalog (each agent's own `config`); every other revision is the
    KV revision of the `catalog` key in `<ns>_catalog`. Without a broker only revision 0 exists (unit tests,
    plan-driven benchmarks)."""

    def __init__(
        self,
        registry: Registry,
        broker: Broker | None = None,
        ns: Namespace | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.registry = registry
        self._broker = broker
        self._spec: KvSpec | None = catalog_spec(ns) if ns is not None else None
        self._key = ns.catalog_key if ns is not None else ""
        self._logger = logger or logging.getLogger("crashsafe.catalog")
        self._builtin = builtin_catalog(registry)
        self._revisions: dict[int, Catalog] = {0: self._builtin}
        self._refused: set[int] = set()
        self.revision = 0  # the revision new runs are pinned to: the newest one that validated

    async def start(self) -> None:
        """Load the newest revision that validates (so the first run already gets it; a refused newest one
        leaves the one before it in force, as it did in the runtime that saw it come), then follow new ones."""
        if self._broker is None or self._spec is None:
            return
        await self._broker.require_stream(self._spec.stream)  # provisioned by the operator, or StreamMissing
        for entry in await self._broker.kv_history(self._spec, self._key):
            self._offered(entry)
        await self._broker.kv_watch(self._spec, self._key, self._on_entry)

    @property
    def refused(self) -> frozenset[int]:
        """Revisions seen on the bucket that failed validation (logged when seen); never given to a run."""
        return frozenset(self._refused)

    async def _on_entry(self, entry: KvEntry) -> None:
        self._offered(entry)

    def _offered(self, entry: KvEntry) -> None:
        """A revision seen on the bucket: taken for new runs if it validates and is newer, refused loudly if not."""
        if entry.revision in self._revisions or entry.revision in self._refused:
            return
        try:
            catalog = read_catalog(entry.value, self.registry, entry.revision)
        except InvalidCatalog as exc:
            self._refused.add(entry.revision)
            metrics.CATALOG_RELOAD_FAILURES.inc()
            log(
                self._logger,
                logging.WARNING,
                "catalog revision refused; new runs keep the last working one",
                revision=entry.revision,
                kept_revision=self.revision,
                problems=exc.problems,
            )
            return
        self._remember(entry.revision, catalog)
        if entry.revision > self.revision:
            self.revision = entry.revision
            metrics.CATALOG_REVISION.set(entry.revision)
            log(
                self._logger,
                logging.INFO,
                "catalog revision loaded",
                revision=entry.revision,
                label=catalog.label,
            )

    def _remember(self, revision: int, catalog: Catalog) -> None:
        self._revisions[revision] = catalog
        spare = sorted(r for r in self._revisions if r not in (0, self.revision, revision))
        for old in spare[: max(len(spare) - CACHED_REVISIONS, 0)]:
            del self._revisions[old]

    def _config(self, catalog: Catalog, agent: str) -> AgentConfig:
        # An agent the catalog does not name runs with its built-in configuration (the catalog may cover a subset).
        config = catalog.agents.get(agent)
        return config if config is not None else self.registry.agent(agent).config

    def current(self, agent: str) -> tuple[int, AgentConfig]:
        """The revision a run starting now is pinned to, and its agent's configuration there."""
        return self.revision, self._config(self._revisions[self.revision], agent)

    async def pinned(self, revision: int, agent: str) -> AgentConfig:
        """The agent's configuration at the revision a run started with, for the rest of that run: from memory,
        else read by revision. A revision the bucket no longer holds is `CatalogRevisionGone`, never another."""
        catalog = self._revisions.get(revision)
        if catalog is None:
            if self._broker is None or self._spec is None:
                raise CatalogRevisionGone(revision=revision, agent=agent)
            entry = await self._broker.kv_get_revision(self._spec, self._key, revision)
            if entry is None:
                raise CatalogRevisionGone(revision=revision, agent=agent)
            catalog = read_catalog(entry.value, self.registry, revision)
            self._remember(revision, catalog)
        return self._config(catalog, agent)

    async def stop(self) -> None:
        return None  # the watch ends with the broker connection


# The operator's side (`crashsafe config`): only the operator's NATS user may write the bucket.


async def publish_catalog(broker: Broker, ns: Namespace, registry: Registry, catalog: Catalog) -> int:
    """Validate `catalog` against this deployment, then write it as the next revision; returns that revision.
    An invalid catalog raises `InvalidCatalog` and nothing is written."""
    problems = validate_catalog(catalog, registry)
    if problems:
        raise InvalidCatalog(problems)
    return await broker.kv_write(
        catalog_spec(ns), ns.catalog_key, catalog_encoder.encode(catalog), revision=None
    )


async def stored_catalog(
    broker: Broker, ns: Namespace, registry: Registry, revision: int | None = None
) -> tuple[int, Catalog]:
    """The catalog at `revision` (None: the newest; 0 or an empty bucket: the built-in) as stored, undecided
    whether it validates (`config show` shows a refused revision too, so the operator can see what is wrong)."""
    if revision == 0:
        return 0, builtin_catalog(registry)
    spec = catalog_spec(ns)
    if revision is None:
        entry = await broker.kv_get(spec, ns.catalog_key)
        if entry is None:
            return 0, builtin_catalog(registry)
    else:
        entry = await broker.kv_get_revision(spec, ns.catalog_key, revision)
        if entry is None:
            raise CatalogRevisionGone(revision=revision, agent="*")
    try:
        return entry.revision, catalog_decoder.decode(entry.value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidCatalog([f"not a catalog: {exc}"], revision=entry.revision) from exc
