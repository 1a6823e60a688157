"""`crashsafe upgrade check|status`: before a rollout, whether this release may run beside what runs now; after it,
whether every live process runs one release. Read from the version heartbeats, as the operator; the verdicts are
crashsafe/domain/release_window.py's."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import nats.js.errors

from crashsafe.contracts.heartbeats import FIRST_BEATING, VersionBeat
from crashsafe.contracts.release import VERSION, previous_release
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.deployment import settings_for
from crashsafe.domain.release_window import Window, check, convergence, described
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.version_census import Census, census


async def _census(state_dir: Path) -> tuple[Census, list[str]]:
    settings = settings_for(state_dir)
    ns = settings.namespace
    async with operator_broker(settings, "crashsafe-upgrade") as broker:
        try:
            readers = await broker.js.consumers_info(ns.stream(StreamKind.RUNS))
        except nats.js.errors.NotFoundError:
            readers = []
        filters = [(c.name, c.config.filter_subject or "") for c in readers]
        return await census(broker, ns), narrow_readers(filters, ns)


def narrow_readers(filters: list[tuple[str, str]], ns: Namespace) -> list[str]:
    """Consumers on RUNS (an analytics team's) that read only the runtime's event classes, `<ns>.run.*.*` or one
    run's `<ns>.run.<id>.*`: since 0.4.0 intents and receipts stand on subjects of their own in the journal (the
    journal as the bus), which such a filter never sees. Each named with the filter that sees every event."""
    classes = ns.run_classes_all.split(".")
    narrow = []
    for name, subject in filters:
        tokens = subject.split(".")
        if len(tokens) == len(classes) and tokens[:2] == classes[:2] and tokens[3] == "*":
            wide = ".".join([*tokens[:3], ">"])
            narrow.append(
                f"consumer {name} on {ns.stream(StreamKind.RUNS)} filters {subject}: since 0.4.0 it misses every "
                f"intent and receipt the journal carries to and from executors; filter {wide} to read each event"
            )
    return narrow


def _table(beats: list[VersionBeat], now: datetime) -> None:
    if not beats:
        print("no live process publishes a version heartbeat")
        return
    rows = [("service", "worker", "version", "beat")]
    rows += [(b.service, b.worker, b.version, f"{(now - b.beat_at).total_seconds():.0f}s ago") for b in beats]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[3])


def _no_bucket(seen: Census) -> None:
    if not seen.bucket:
        print(
            f"no versions bucket: no process runs {FIRST_BEATING} or later here (`crashsafe infra apply` makes it)"
        )


async def upgrade_check(state_dir: Path) -> int:
    """Every live process with its release and the age of its heartbeat; 0 if this release may run beside each,
    1 naming those it may not."""
    seen, narrow = await _census(state_dir)
    for reader in narrow:
        print(f"warning: {reader}", file=sys.stderr)
    window = Window()
    # A process of a release before heartbeats is taken to run the newest such release the record names.
    before = previous_release(FIRST_BEATING)
    verdict = check(seen.beats, seen.waiting, window, before.version if before else None)
    _no_bucket(seen)
    _table(seen.beats, datetime.now(UTC))
    for quiet in verdict.unheard:
        print(f"{quiet} (taken to run {before.version if before else 'an unrecorded release'})")
    if verdict.ok:
        print(f"compatible: {VERSION} runs beside every live process ({window})")
        return 0
    refused = [described(b) for b in verdict.incompatible]
    refused += [str(u) for u in verdict.unheard] if not verdict.unheard_compatible else []
    print(f"incompatible with {VERSION} (runs beside {window}): {'; '.join(refused)}", file=sys.stderr)
    return 1


async def upgrade_status(state_dir: Path) -> int:
    """0 and `converged on X` once every live process runs one release; 1 and `mixed: …` (or none heard) else."""
    seen, _ = await _census(state_dir)
    _no_bucket(seen)
    state = convergence(seen.beats, seen.waiting)
    if state.converged_on is not None:
        print(f"converged on {state.converged_on} ({len(seen.beats)} process(es))")
        return 0
    if not state.versions and not state.unheard:
        print("no live process publishes a version heartbeat", file=sys.stderr)
        return 1
    print(f"mixed: {state.mixed()}", file=sys.stderr)
    return 1
