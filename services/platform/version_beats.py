"""A service process's version heartbeat: which release it runs, kept in `<ns>_versions` while it lives, so a
rolling upgrade can tell which releases are alive (`crashsafe upgrade check|status`, `crashsafe infra contract`).

Never in the way of serving: a bucket not provisioned yet (an older `infra apply`), a permission not rolled out or
NATS away is one warning, and the beat is tried again at its next turn. Readiness does not look at it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import UTC, datetime

import msgspec

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.heartbeats import BEAT_EVERY_S, BEAT_TTL_S, VersionBeat, beat_encoder
from crashsafe.contracts.nats_permissions import Role, user_name
from crashsafe.contracts.release import RUNS_BESIDE_SINCE, VERSION
from crashsafe.contracts.streams import versions_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log

# How long a clean stop waits to take its heartbeat away (NATS away: the TTL does it).
_STOP_WAIT_S = 2.0


class VersionBeats:
    """Writes this process's `VersionBeat` under `beat.<service>.<worker>` every `every_s`, each with a TTL of
    `ttl_s`; deletes it on a clean stop. A process killed leaves the bucket when its last beat's TTL runs out."""

    def __init__(
        self,
        broker: Broker,
        ns: Namespace,
        role: Role,
        worker: str,
        logger: logging.Logger,
        family: str | None = None,
        *,
        ttl_s: int = BEAT_TTL_S,
        every_s: float = BEAT_EVERY_S,
    ) -> None:
        self.broker = broker
        self.spec = versions_spec(ns)
        service = user_name(role, family)
        self.key = ns.version_beat_key(service, worker)
        self.logger = logger
        self.ttl_s = ttl_s
        self.every_s = every_s
        now = datetime.now(UTC)
        self.beat = VersionBeat(
            version=VERSION,
            runs_beside_since=RUNS_BESIDE_SINCE,
            service=service,
            worker=worker,
            pid=os.getpid(),
            started_at=now,
            beat_at=now,
        )
        self._failing = False
        self._revision = 0  # of the last heartbeat this process wrote: the one a clean stop may take away
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Say which release this process runs (a log line) and beat from now on, the first beat at once."""
        log(
            self.logger,
            logging.INFO,
            "crashsafe version",
            version=VERSION,
            runs_beside_since=RUNS_BESIDE_SINCE,
            worker=self.beat.worker,
        )
        self._task = asyncio.create_task(self._beat_forever())

    async def stop(self) -> None:
        """Stop beating and take the heartbeat away, if it is still this process's (a replacement with the same
        worker id may have written its own since); a delete that fails is left to the TTL."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(CrashsafeError, TimeoutError):
            await asyncio.wait_for(self._take_away(), _STOP_WAIT_S)

    async def beat_once(self) -> bool:
        """One heartbeat written; False (and one warning per outage) if it could not be."""
        self.beat = msgspec.structs.replace(self.beat, beat_at=datetime.now(UTC))
        try:
            self._revision = await self.broker.kv_write(
                self.spec, self.key, beat_encoder.encode(self.beat), revision=None, ttl_s=self.ttl_s
            )
        except CrashsafeError as exc:
            if not self._failing:
                log(
                    self.logger,
                    logging.WARNING,
                    "version heartbeat not written; serving goes on (`crashsafe infra apply` provisions its"
                    f" bucket {self.spec.bucket}, docs/security.md permits it)",
                    key=self.key,
                    code=exc.code.value,
                    problem=exc.message,
                )
            self._failing = True
            return False
        if self._failing:
            log(self.logger, logging.INFO, "version heartbeat written again", key=self.key)
        self._failing = False
        return True

    async def _beat_forever(self) -> None:
        while True:
            await self.beat_once()
            await asyncio.sleep(self.every_s)

    async def _take_away(self) -> None:
        if self._revision:  # still at our last write (LeaseConflict otherwise: a newer process took the key)
            await self.broker.kv_delete(self.spec, self.key, revision=self._revision)
