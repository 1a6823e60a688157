"""What a live service process says about itself in `<ns>_versions`: the release it runs, so a rolling upgrade can
tell which releases are alive (`crashsafe upgrade check|status`, `crashsafe infra contract`)."""

from __future__ import annotations

from datetime import datetime

import msgspec

# How long a heartbeat outlives its last renewal (the key's TTL), and how often a process renews it: a process
# killed without a clean stop leaves the bucket within a TTL; three renewals may be lost before it does.
BEAT_TTL_S = 15
BEAT_EVERY_S = 5.0
# The first release whose processes publish heartbeats: a process seen without one runs an older release.
FIRST_BEATING = "0.2.0"


class VersionBeat(msgspec.Struct, frozen=True, kw_only=True):
    """One process's heartbeat under `beat.<service>.<worker>`, rewritten every `BEAT_EVERY_S` with a TTL.

    `service` is the process's NATS user (`runtime`, `executor-payment`); `runs_beside_since` the oldest release
    it runs beside on one broker, so an older release's tools can tell whether a newer process accepts them."""

    version: str  # the release the process runs (`contracts.release.VERSION`)
    runs_beside_since: str  # the oldest release it runs beside on one broker
    service: str  # its NATS user: `gateway`, `runtime`, `executor-<family>`, `reconciler`, `projector`
    worker: str  # its CRASHSAFE_WORKER_ID (a pod's name)
    pid: int
    started_at: datetime  # when the process started beating
    beat_at: datetime  # when this heartbeat was written (renewed every `BEAT_EVERY_S`)


beat_encoder = msgspec.json.Encoder()
beat_decoder = msgspec.json.Decoder(VersionBeat)


# Beside the heartbeats: the release the namespace was last contracted to (`crashsafe infra contract`). Past it no
# older release may come back (its rollback promise ends there), so what only that promise held back (the
# journals' archive and purge) may start.
CONTRACTED_KEY = "contracted"


class Contracted(msgspec.Struct, frozen=True, kw_only=True):
    """`contracted` in `<ns>_versions`: written by `infra contract` once no older process was alive."""

    release: str  # the release that ran the contracting step (`contracts.release.VERSION`)
    at: datetime


contracted_encoder = msgspec.json.Encoder()
contracted_decoder = msgspec.json.Decoder(Contracted)
