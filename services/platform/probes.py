"""The ops port of a service: liveness, readiness over its real seams (NATS, streams, consumers, leases, store),
and its Prometheus metrics, on a small HTTP server beside its work (Kubernetes probes and scrapes read it)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.streams import ConsumerSpec, KvSpec
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker

log = logging.getLogger("crashsafe.probes")

# A check answers None when its seam works, else why not (a short sentence an operator acts on); raising or not
# answering in CHECK_TIMEOUT_S is a failure too. A probe must answer well inside Kubernetes' 1 s default: half of
# it for the checks leaves the other half to a loaded node's event loop (at 0.8 s a paused NATS was answered in
# 1.34 s once, in a clean-clone CI run on 2 busy cores). A healthy seam answers in milliseconds.
Check = Callable[[], Awaitable[str | None]]
Sampler = Callable[[], Awaitable[None]]
CHECK_TIMEOUT_S = 0.5
# How often a service reads its durables' num_pending (one consumer_info each): gauges, never per message.
SAMPLE_S = 5.0
OK = "ok"
NATS = "nats"  # the check every other one depends on


# The verdict (pure) ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [name for name, result in self.checks.items() if result != OK]

    @property
    def missing(self) -> list[str]:
        """The failed checks' subjects as the gateway always named them: `nats`, a stream's or bucket's name."""
        return [name.split(":", 1)[-1] for name in self.failed]

    def body(self) -> dict[str, Any]:
        """What /readyz answers: `ready`, `missing` (as the gateway always said), every check's `ok` or reason."""
        return {"ready": self.ready, "missing": self.missing, "checks": self.checks}


def verdict(results: Mapping[str, str | None]) -> Readiness:
    """Ready only if there is something to check and every check passed; a failed one keeps its reason (blank
    reasons are named, never shown as an empty string)."""
    checks = {name: OK if why is None else (why.strip() or "failed") for name, why in results.items()}
    return Readiness(ready=bool(checks) and all(r == OK for r in checks.values()), checks=checks)


# Checks over the real seams (what a service writes and reads through: services/platform/seam_checks.py) --------


def nats_connected(broker: Broker) -> Check:
    async def check() -> str | None:
        return None if broker.connected else "not connected to NATS (reconnecting)"

    return check


def stream_present(broker: Broker, name: str) -> Check:
    async def check() -> str | None:
        return None if await broker.stream_exists(name) else f"stream {name} does not exist"

    return check


def bucket_present(broker: Broker, spec: KvSpec) -> Check:
    async def check() -> str | None:
        return None if await broker.stream_exists(spec.stream) else f"bucket {spec.bucket} does not exist"

    return check


def basic_checks(
    broker: Broker, streams: Iterable[str] = (), buckets: Iterable[KvSpec] = ()
) -> dict[str, Check]:
    """NATS connected, and every stream and bucket a service uses present (it was checked at start; an operator
    may delete one since)."""
    checks: dict[str, Check] = {NATS: nats_connected(broker)}
    checks.update({f"stream:{name}": stream_present(broker, name) for name in streams})
    checks.update({f"bucket:{spec.bucket}": bucket_present(broker, spec) for spec in buckets})
    return checks


def lag_sampler(broker: Broker, specs: Callable[[], Iterable[ConsumerSpec]]) -> Sampler:
    """Each durable's num_pending into crashsafe_consumer_lag (the current specs: an executor's change with its
    partitions). A durable no longer in them loses its child: its new holder reports it, this replica's last
    value would stand beside that for ever."""
    children: dict[tuple[str, str], Any] = {}

    async def sample() -> None:
        current = list(specs())
        for gone in children.keys() - {(spec.stream, spec.durable) for spec in current}:
            del children[gone]
            metrics.CONSUMER_LAG.remove(*gone)
        for spec in current:
            pending = await broker.consumer_pending(spec.stream, spec.durable)
            if pending is None:
                continue
            child = children.get((spec.stream, spec.durable))
            if child is None:
                child = children[(spec.stream, spec.durable)] = metrics.CONSUMER_LAG.labels(
                    spec.stream, spec.durable
                )
            child.set(pending)

    return sample


async def run_checks(checks: Mapping[str, Check], timeout_s: float = CHECK_TIMEOUT_S) -> Readiness:
    """Every check at once, each bounded; the verdict, also written to crashsafe_ready{check}. Without a NATS
    connection nothing else is asked (each would only wait out its timeout): the answer is `nats` alone."""

    async def one(check: Check) -> str | None:
        try:
            return await asyncio.wait_for(check(), timeout_s)
        except TimeoutError:
            return f"no answer within {timeout_s:g}s"
        except Exception as exc:  # noqa: BLE001 -- a probe reports a broken seam; it never raises into the server
            return f"{type(exc).__name__}: {exc}"[:300]

    first = {NATS: await one(checks[NATS])} if NATS in checks else {}
    if first.get(NATS) is not None:
        readiness = verdict(first)
        _report(dict.fromkeys(checks, 0))
        return readiness
    names = [n for n in checks if n != NATS]
    results = await asyncio.gather(*(one(checks[n]) for n in names))
    readiness = verdict({**first, **dict(zip(names, results, strict=True))})
    _report({name: 1 if result == OK else 0 for name, result in readiness.checks.items()})
    return readiness


# The checks crashsafe_ready last had a child for (one readiness per process, like the registry itself).
_reported: set[str] = set()


def _report(values: Mapping[str, int]) -> None:
    """crashsafe_ready{check} as this probe found it; a check no longer asked (`started` once the service is up, a
    partition handed on) loses its child, or its last 0 would read as a failure for ever."""
    for name in _reported - values.keys():
        metrics.READY.remove(name)
    for name, value in values.items():
        metrics.READY.labels(name).set(value)
    _reported.clear()
    _reported.update(values)


# Liveness: the event loop turns ---------------------------------------------------------------------------------

EXIT_STALLED = 70  # the exit code of a process whose event loop stopped turning (EX_SOFTWARE)
BEAT_S = 0.25


class Watchdog:
    """Whether the event loop still turns: a callback on the loop stamps the time every BEAT_S, a thread of its own
    reads the stamp. A loop held by code that never awaits answers no probe at all; past `stall_s` the thread
    logs where the loop is stuck and ends the process, so the supervisor (or Kubernetes) starts a fresh one.

    Only time the thread itself saw pass counts: a process stopped whole (SIGSTOP, a suspended VM) is not a
    stalled loop when it resumes."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._beat = time.monotonic()
        self._stalled_s = 0.0
        self._loop_thread = threading.get_ident()
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Called on the watchdog's thread, with how long the loop has stood, just before the process ends: what
        # the service must remember of the stall (the runtime: which run's agent held it), bounded by the callee.
        self.on_stall: Callable[[float], None] | None = None

    @property
    def stalled_s(self) -> float:
        """How long the loop has not turned, as the watchdog's thread saw it."""
        return self._stalled_s

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._stamp()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def _stamp(self) -> None:
        self._beat = time.monotonic()
        self._handle = asyncio.get_running_loop().call_later(BEAT_S, self._stamp)

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            seen = min(now - last, 2 * BEAT_S)  # a whole-process pause counts for one tick at most
            last = now
            self._stalled_s = self._stalled_s + seen if now - self._beat > 2 * BEAT_S else 0.0
            if self._stalled_s >= self.stall_s:
                self._end()

    def _end(self) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        where = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "unknown"
        log.critical(
            "event loop has not turned for %.1fs (CRASHSAFE_LOOP_STALL_S=%g): exiting %d to be restarted; it is at\n%s",
            self._stalled_s,
            self.stall_s,
            EXIT_STALLED,
            where,
        )
        if self.on_stall is not None:
            try:
                self.on_stall(self._stalled_s)
            except Exception:  # noqa: BLE001 -- the process ends whatever the callback did
                log.exception("the stall's callback failed")
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_STALLED)


# The server ---------------------------------------------------------------------------------------------------


async def _starting() -> str | None:
    return "starting: not yet connected and subscribed"


class OpsServer:
    """GET /healthz, /readyz and /metrics on `host:port` (0: a free port, printed). Started first thing, so
    liveness answers while the service connects; not ready until `serve` hands it the service's checks."""

    def __init__(
        self, host: str, port: int, sample_s: float = SAMPLE_S, stall_s: float | None = None
    ) -> None:
        self.host = host
        self.port = port
        # A service's process (`stall_s` from CRASHSAFE_LOOP_STALL_S) watches its loop; a test's in-process one not.
        self.watchdog = Watchdog(stall_s) if stall_s is not None else None
        self._checks: Callable[[], Mapping[str, Check]] = lambda: {"started": _starting}
        self._samplers: list[Sampler] = []
        self.sample_s = sample_s
        self._runner: web.AppRunner | None = None
        self._sampling: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def checks(self) -> Mapping[str, Check]:
        return self._checks()

    def serve(
        self,
        checks: Mapping[str, Check] | Callable[[], Mapping[str, Check]],
        samplers: Iterable[Sampler] = (),
    ) -> None:
        """The service is up: readiness asks its checks (a callable is asked afresh each probe), and its gauges
        are sampled every `sample_s`."""
        self._checks = checks if callable(checks) else (lambda: checks)
        self._samplers = list(samplers)
        if self._samplers and self._sampling is None:
            self._sampling = asyncio.create_task(self._sample_forever())

    async def start(self) -> OpsServer:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise InvalidSetting(
                variable="CRASHSAFE_OPS_PORT",
                value=str(self.port),
                expected=f"a port free on {self.host} ({exc.strerror or exc}); 0 picks one",
            ) from None
        server = site._server  # aiohttp keeps the bound socket here; the only way to learn port 0's choice
        sockets = getattr(server, "sockets", None)
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        print(f"ops listening on {self.url}", flush=True)
        if self.watchdog is not None:
            self.watchdog.start()
        return self

    async def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._sampling is not None:
            self._sampling.cancel()
            await asyncio.gather(self._sampling, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def sample(self) -> None:
        for sampler in self._samplers:
            try:
                await asyncio.wait_for(sampler(), self.sample_s)
            except Exception as exc:  # noqa: BLE001 -- NATS away: gauges keep their last value; readiness says why
                log.debug("metrics sample failed: %s: %s", type(exc).__name__, exc)

    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            await self.sample()
            await asyncio.sleep(max(self.sample_s - (time.monotonic() - started), 0.1))

    # Liveness never touches NATS: a broker outage must not get every pod restarted. It is the event loop: one
    # that does not turn answers nothing (a probe's timeout), then the watchdog ends the process.
    async def _healthz(self, request: web.Request) -> web.Response:
        watchdog = self.watchdog
        if watchdog is not None and watchdog.stalled_s >= watchdog.stall_s / 2:
            return web.json_response(
                {"status": "stalled", "stalled_s": round(watchdog.stalled_s, 1)}, status=503
            )
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        readiness = await run_checks(self.checks())
        return web.json_response(readiness.body(), status=200 if readiness.ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=metrics.exposition())
        response.headers["Content-Type"] = metrics.CONTENT_TYPE
        return response
