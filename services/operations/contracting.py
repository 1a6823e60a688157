"""`crashsafe infra contract`: the steps that take away what only an older release used, run once none is alive.

`infra apply` only adds (services/platform/provisioning.py): a stream keeps the subjects an older release writes, and
journals of an older layout stay where they are. Contracting copies the journals of the layout before event classes
onto this one's (services/operations/journal_layout.py), narrows each stream to this release's subjects and records
the release it contracted to (`contracted` in `<ns>_versions`: the journals' archive waits for it). It
refuses (`UpgradeBlocked`, nothing changed) while a live process runs a release older than this one, judged by the
version heartbeats, or while a runtime or projector is seen pulling that no heartbeat of this release accounts for
(a release before heartbeats: the guard the migration had)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from crashsafe.contracts.errors import UpgradeBlocked
from crashsafe.contracts.heartbeats import CONTRACTED_KEY, Contracted, contracted_encoder
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.streams import StreamSpec, stream_specs, versions_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.release_window import contract_blockers
from crashsafe.services.operations.journal_layout import LayoutMigration, has_old_layout, migrate_journals
from crashsafe.services.operations.version_census import census
from crashsafe.services.platform.jetstream import Broker

log = logging.getLogger("crashsafe.operations")
STEP = "infra contract"


@dataclass(frozen=True, slots=True)
class Contraction:
    """What a contracting step did: journals copied, and the subjects each stream no longer takes."""

    journals: LayoutMigration = LayoutMigration()
    narrowed: dict[str, list[str]] = field(default_factory=dict)


async def _beyond_spec(broker: Broker, specs: list[StreamSpec]) -> dict[str, list[str]]:
    """Per stream, the subjects it takes that this release does not declare (an older release's)."""
    found: dict[str, list[str]] = {}
    for spec in specs:
        taken = await broker.stream_subjects(spec.name) or []
        if extra := [s for s in taken if s not in spec.subjects]:
            found[spec.name] = extra
    return found


async def contract(broker: Broker, ns: Namespace, replicas: int = 1) -> Contraction | None:
    """Run the namespace's contracting steps as the operator; None when there is nothing to contract. Raises
    UpgradeBlocked, having changed nothing, while an older process may be alive: even with nothing to contract
    today, an operator asking in the middle of a roll is told it is not over, never "nothing to do"."""
    seen = await census(broker, ns)
    blockers = contract_blockers(seen.beats, seen.waiting, VERSION)
    if blockers:
        raise UpgradeBlocked(step=STEP, processes=blockers)
    if seen.bucket:
        # Past this no older release comes back: what only its rollback held back may start (the journals'
        # archive, services/reconciler/journal_archiver.py). Written even with nothing else to contract.
        marker = Contracted(release=VERSION, at=datetime.now(UTC))
        await broker.kv_write(
            versions_spec(ns), CONTRACTED_KEY, contracted_encoder.encode(marker), revision=None
        )
    specs = stream_specs(ns, replicas)
    if not await has_old_layout(broker, ns) and not await _beyond_spec(broker, specs):
        return None
    journals = await migrate_journals(broker, ns, replicas)
    narrowed = {}
    for spec in specs:  # the copy may have widened RUNS for its own while
        if dropped := await broker.narrow_stream(spec):
            narrowed[spec.name] = dropped
    if narrowed:
        log.warning("streams narrowed to this release's subjects: %s", narrowed)
    return Contraction(journals, narrowed)
