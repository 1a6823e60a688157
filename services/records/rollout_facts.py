"""What the versions bucket says about a rollout: the release the namespace was contracted to and the live
processes' heartbeats. Read by every step that waits on the rollout (the journals' archive, the facts' expiry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec

from crashsafe.contracts.heartbeats import CONTRACTED_KEY, VersionBeat, beat_decoder, contracted_decoder
from crashsafe.contracts.streams import versions_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.release_window import live
from crashsafe.services.platform.jetstream import Broker


@dataclass(frozen=True, slots=True)
class RolloutFacts:
    """`unreadable`: a record that did not decode (said instead of guessing: every step waits on it)."""

    contracted: str | None = None
    beats: list[VersionBeat] = field(default_factory=list)
    unreadable: str | None = None


async def read_rollout(broker: Broker, ns: Namespace) -> RolloutFacts:
    """The bucket's records as of now, heartbeats older than their TTL left out."""
    spec = versions_spec(ns)
    try:
        entry = await broker.kv_get(spec, CONTRACTED_KEY)
        contracted = contracted_decoder.decode(entry.value).release if entry is not None else None
        beats = [beat_decoder.decode(e.value) for e in await broker.kv_scan(spec, ns.version_beats_all)]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return RolloutFacts(unreadable=f"the versions bucket holds a record that does not decode: {exc}")
    return RolloutFacts(contracted, live(beats, datetime.now(UTC)))
