"""Which processes run on a broker now, as the operator reads it: the live version heartbeats (`<ns>_versions`),
and the pull requests waiting on the durables of the services that wrote the journals before heartbeats (runtime,
projector), which is all a release before `FIRST_BEATING` leaves to be seen by."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from crashsafe.contracts.heartbeats import VersionBeat, beat_decoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import (
    ConsumerSpec,
    projector_planner_consumer,
    runtime_consumers,
    versions_spec,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.release_window import Waiting, live
from crashsafe.services.platform.jetstream import Broker

log = logging.getLogger("crashsafe.operations")

# Each process keeps at most one pull request waiting per durable, and none for a moment between two: the most
# seen over a few looks is the count of processes pulling (bounded by them), not one look's chance.
LOOKS = 3
LOOK_GAP_S = 0.3


@dataclass(frozen=True, slots=True)
class Census:
    beats: list[VersionBeat]  # the live ones, by service and worker
    waiting: list[Waiting]  # pull requests on the writers' durables, where any
    bucket: bool  # the versions bucket exists (an older `infra apply` made none: no process could beat)


def pulled_by_writers(ns: Namespace) -> list[tuple[str, ConsumerSpec]]:
    """The durables a live runtime or projector pulls from, by service: a process pulling there may write the
    journals (the guard the journal-layout migration had before heartbeats)."""
    return [
        *((Role.RUNTIME.value, c) for c in runtime_consumers(ns)),
        (Role.PROJECTOR.value, projector_planner_consumer(ns)),
    ]


async def census(broker: Broker, ns: Namespace, looks: int = LOOKS, gap_s: float = LOOK_GAP_S) -> Census:
    spec = versions_spec(ns)
    bucket = await broker.stream_exists(spec.stream)
    beats: list[VersionBeat] = []
    for entry in await broker.kv_scan(spec, ns.version_beats_all) if bucket else []:
        try:
            beats.append(beat_decoder.decode(entry.value))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("a version heartbeat that does not decode, left out: %s: %s", entry.key, exc)
    writers = pulled_by_writers(ns)
    most = dict.fromkeys(range(len(writers)), 0)
    for n in range(looks):
        if n:
            await asyncio.sleep(gap_s)
        for i, (_, c) in enumerate(writers):
            most[i] = max(most[i], await broker.consumer_pullers(c.stream, c.durable))
    waiting = [
        Waiting(service, f"{c.stream}/{c.durable}", most[i])
        for i, (service, c) in enumerate(writers)
        if most[i]
    ]
    return Census(live(beats, datetime.now(UTC)), waiting, bucket)
