"""The chaos soak: booking runs while every process `crashsafe up` started is SIGKILLed at random, the sandbox
and nats-server included; the soak restarts nothing itself (the stack's supervisor must), then counts what broke."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx

from crashsafe.contracts.capabilities import key_id
from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.projections import ProjectionStatus, record_decoder
from crashsafe.contracts.run_events import RunCompleted, RunHandedOff
from crashsafe.contracts.streams import projections_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.deployment import api_key_for
from crashsafe.evidence_verify import verify
from crashsafe.sandbox.listing import SandboxListing
from crashsafe.sandbox.records import LedgerEntry
from crashsafe.services.agents import stayhub
from crashsafe.services.operations.provider_audit import audit_all
from crashsafe.services.operations.run_evidence import gather, walk_checkpoints
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess, Settings
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.capability_keys import public_path, read_public_keys
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.stack import NATS
from crashsafe.stack_keys import API_KEY_FILE, capability_key_path
from crashsafe.stack_processes import ProcessIdentity

T = TypeVar("T")

# Projection retries (2 s … 5 minutes when real) at a twentieth: a receiver killed in the soak is retried soon.
SOAK_ENV = {"CRASHSAFE_PROJECTION_TIME_SCALE": "0.05"}  # the default ack wait (1 s), as deployed

BOOKING = "Book a room in {city} from 2031-12-{d1:02d} to 2031-12-{d2:02d}"
CITIES = ("Lisbon", "Berlin", "Paris")


@dataclass
class ChaosReport:
    runs_submitted: int = 0
    runs_accepted: int = 0
    completed: int = 0
    handed_off: int = 0
    lost: int = 0
    duplicate_effects: int = 0
    orphan_charges: int = 0
    charges_on_released_rooms: int = 0
    audit_findings: int = 0
    audit_kinds: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    # A kill the supervisor had not yet answered (the process was still down): nothing to kill.
    missed_kills: int = 0
    restarts: Counter[str] = field(default_factory=Counter)
    killed_sandbox: bool = False
    killed_nats: bool = False
    scale: dict[str, int] = field(default_factory=dict)
    drain_s: float = 0.0
    total_s: float = 0.0
    handoff_reasons: Counter[str] = field(default_factory=Counter)
    # Projections (seed 002), once the stack settles: each booking that stayed paid has exactly one confirmation
    # email and one CRM record, and no projection gave up.
    paid_bookings: int = 0
    projections_missing: int = 0
    projections_duplicated: int = 0
    projections_dead: int = 0
    projections_settle_s: float = 0.0
    # Evidence (issue 34): each accepted run checked as `crashsafe verify --live` checks it, against every head the
    # checkpoint stream signed for it; none may be tampered, and the stream may have no break.
    evidence: Counter[str] = field(default_factory=Counter)
    checkpoint_breaks: int = 0
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.evidence["tampered"] == 0
            and self.checkpoint_breaks == 0
            and self.lost == 0
            and self.duplicate_effects == 0
            and self.orphan_charges == 0
            and self.charges_on_released_rooms == 0
            and self.audit_findings == 0
            and self.projections_missing == 0
            and self.projections_duplicated == 0
            and self.projections_dead == 0
        )

    def lines(self) -> list[str]:
        kills = ", ".join(f"{name} {n}" for name, n in sorted(self.kills.items()))
        restarts = ", ".join(f"{name} {n}" for name, n in sorted(self.restarts.items()) if n)
        scale = ",".join(f"{k}={v}" for k, v in self.scale.items()) or "one of each"
        return [
            f"stack: {scale}; killed: every service"
            + (", the sandbox" if self.killed_sandbox else " but the sandbox (sandbox kills OFF)")
            + (", nats-server" if self.killed_nats else " (nats-server kills OFF)"),
            f"runs submitted {self.runs_submitted}, accepted {self.runs_accepted}",
            f"completed {self.completed}, handed off {self.handed_off} {dict(self.handoff_reasons) or ''}",
            f"lost {self.lost} (must be 0), duplicate effects {self.duplicate_effects} (must be 0), orphan charges {self.orphan_charges} (must be 0)",
            f"charges on released rooms {self.charges_on_released_rooms} (must be 0)",
            f"audit findings {self.audit_findings} (must be 0) {dict(self.audit_kinds) or ''}",
            f"paid bookings {self.paid_bookings}: projections missing {self.projections_missing}, duplicated"
            f" {self.projections_duplicated}, dead {self.projections_dead} (all must be 0; settled"
            f" {self.projections_settle_s:.1f}s after the drain)",
            f"kills ({sum(self.kills.values())}, {self.missed_kills} found the process still down): {kills}",
            f"restarts by the stack's supervisor: {restarts}",
            f"evidence: {dict(self.evidence) or 'not checked'} (tampered must be 0; incomplete: a run whose last"
            f" heads died with a runtime's last second), checkpoint stream breaks {self.checkpoint_breaks} (must be 0)",
            f"drained {self.drain_s:.1f}s after the last kill; {self.total_s:.1f}s in all",
        ] + [f"  {f}" for f in self.findings[:20]]


@dataclass(frozen=True)
class UpStack:
    """A stack `crashsafe up` runs in its own process, seen as an operator sees it: through stack.json."""

    state_dir: Path
    process: subprocess.Popen[bytes]

    def state(self) -> dict[str, Any]:
        path = self.state_dir / "stack.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    @property
    def gateway_url(self) -> str:
        return str(self.state()["gateway_url"])

    @property
    def api_key(self) -> str:
        """The admin key `crashsafe up` wrote for its own clients (never in stack.json)."""
        key = api_key_for(self.state_dir)
        assert key, f"no API key in CRASHSAFE_API_KEY or {self.state_dir / API_KEY_FILE}"
        return key


def start_up(
    state_dir: Path, scale: Mapping[str, int], env: Mapping[str, str], timeout_s: float = 90.0
) -> UpStack:
    """`crashsafe up --state-dir … --scale …`, waited on until its stack.json says it is running."""
    state_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "crashsafe.cli", "up", "--state-dir", str(state_dir)]
    if scale:
        args += ["--scale", ",".join(f"{k}={v}" for k, v in scale.items())]
    with open(state_dir / "up.log", "ab") as log:
        process = subprocess.Popen(
            args, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    up = UpStack(state_dir, process)
    deadline = time.monotonic() + timeout_s
    while up.state().get("status") != "running":
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(
                f"crashsafe up did not start; see {state_dir / 'up.log'} and {state_dir / 'logs'}"
            )
        time.sleep(0.1)
    return up


def stop_up(up: UpStack) -> None:
    from crashsafe.down import down

    down(up.state_dir)
    try:
        up.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        up.process.kill()
        up.process.wait()


async def soak(
    state_dir: Path,
    runs: int = 300,
    duration_s: float = 60.0,
    kill_every_s: tuple[float, float] = (1.0, 3.0),
    drain_timeout_s: float = 240.0,
    seed: int | None = None,
    kill_nats: bool = True,
    kill_sandbox: bool = True,
    scale: Mapping[str, int] | None = None,
    projections_timeout_s: float = 120.0,
) -> ChaosReport:
    rng = random.Random(seed)
    report = ChaosReport(killed_sandbox=kill_sandbox, killed_nats=kill_nats, scale=dict(scale or {}))
    started = time.monotonic()
    up = await asyncio.to_thread(start_up, state_dir, report.scale, SOAK_ENV)
    state = up.state()
    broker: Broker | None = None
    accepted: set[str] = set()
    try:
        broker = await Broker.connect(
            str(state["nats_url"]),
            "chaos",
            access=NatsAccess(
                creds=Path(str(state["operator_creds"])) if state.get("operator_creds") else None
            ),
        )
        submitter = asyncio.create_task(
            _submit_all(up.gateway_url, up.api_key, runs, duration_s, rng, accepted, report)
        )
        await _kill_loop(up, duration_s, kill_every_s, rng, report, kill_nats, kill_sandbox)
        last_kill = time.monotonic()
        await submitter
        report.runs_accepted = len(accepted)
        terminal = await _drain(broker, Namespace(str(state["namespace"])), accepted, drain_timeout_s)
        report.drain_s = time.monotonic() - last_kill
        for run_id in accepted:
            event = terminal.get(run_id)
            if isinstance(event, RunCompleted):
                report.completed += 1
            elif isinstance(event, RunHandedOff):
                report.handed_off += 1
                report.handoff_reasons[event.reason] += 1
            else:
                report.lost += 1
                report.findings.append(f"lost: {run_id} not terminal after {drain_timeout_s:.0f}s")
        async with Providers.connect(str(state["sandbox_url"])) as providers:
            listing = SandboxListing(providers.http)
            _count_effects((await _when_back(listing.view)).entries, report)
            settle_from = time.monotonic()
            await _settle_projections(listing, report, projections_timeout_s)
            report.projections_settle_s = time.monotonic() - settle_from
            await _count_dead_projections(broker, Namespace(str(state["namespace"])), report)
            settings = Settings(
                nats_url=str(state["nats_url"]),
                namespace=Namespace(str(state["namespace"])),
                sandbox_url=str(state["sandbox_url"]),
            )
            findings, _ = await audit_all(broker, settings, stayhub(), providers, listing)
        report.audit_findings = len(findings)
        report.audit_kinds = Counter(str(f.kind) for f in findings)
        await _check_evidence(broker, Namespace(str(state["namespace"])), up.state_dir, accepted, report)
        report.findings += [f"audit: {f.kind} {f.key}: {f.detail}" for f in findings]
        report.restarts = Counter({s["name"]: int(s["restarts"]) for s in up.state().get("services", [])})
    finally:
        if broker is not None:
            await broker.close()
        await asyncio.to_thread(stop_up, up)
    report.total_s = time.monotonic() - started
    return report


async def _check_evidence(
    broker: Broker, ns: Namespace, state_dir: Path, runs: Iterable[str], report: ChaosReport
) -> None:
    """Every run's bundle (providers not asked: the audit did) verified against the stack's own public key."""
    key = read_public_keys([public_path(capability_key_path(state_dir))])[0]
    trusted = {key_id(key): key.public_bytes_raw()}
    registry = stayhub()
    walk = await walk_checkpoints(broker, ns, trusted)
    report.checkpoint_breaks = len(walk.breaks)
    report.findings += [f"checkpoints: {b}" for b in walk.breaks]
    for run_id in runs:
        bundle = await gather(
            broker,
            ns,
            registry,
            "",
            run_id,
            [key],
            ask_providers=False,
            known_proofs=walk.proofs.get(run_id, []),
        )
        if bundle is None:
            report.evidence["missing"] += 1
            continue
        verification = verify(bundle, trusted, registry)
        report.evidence[str(verification.verdict)] += 1
        if verification.verdict == "tampered":
            report.findings += [f"evidence {run_id}: {f.check} {f.message}" for f in verification.problems()][
                :5
            ]


async def _when_back(read: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """Read once the process is back: a sandbox killed in the last round is restarted by the supervisor, not us."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await read()
        # The listing reads through a provider's client (aiohttp); the gateway's answers through httpx.
        except (httpx.TransportError, aiohttp.ClientConnectionError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _submit_all(
    gateway_url: str,
    api_key: str,
    runs: int,
    duration_s: float,
    rng: random.Random,
    accepted: set[str],
    report: ChaosReport,
) -> None:
    """Spread the runs over the kill window; each is retried with its own key until the gateway accepts it."""
    gap = duration_s * 0.8 / max(runs, 1)
    slots = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        d1 = rng.randint(1, 20)
        body = {
            "event_id": f"chaos-{uuid.uuid4().hex}",
            "session_id": f"sess-{i}",
            "guest_id": f"guest-{i}",
            "text": BOOKING.format(city=rng.choice(CITIES), d1=d1, d2=d1 + rng.randint(1, 5)),
        }
        async with (
            slots,
            httpx.AsyncClient(
                base_url=gateway_url, timeout=5, headers={"authorization": f"Bearer {api_key}"}
            ) as client,
        ):
            deadline = time.monotonic() + duration_s + 120
            while time.monotonic() < deadline:
                try:
                    response = await client.post("/v1/events", json=body)
                    if response.status_code == 202:
                        accepted.add(response.json()["run_id"])
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)

    tasks = []
    for i in range(runs):
        report.runs_submitted += 1
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)


async def _kill_loop(
    up: UpStack,
    duration_s: float,
    every: tuple[float, float],
    rng: random.Random,
    report: ChaosReport,
    kill_nats: bool,
    kill_sandbox: bool,
) -> None:
    """SIGKILL the processes stack.json lists, checked by identity, in rounds: each round kills every one of
    them once in a random order, so a short soak still kills each process. It never restarts anything."""
    end = time.monotonic() + duration_s
    round_: list[str] = []
    while time.monotonic() < end:
        await asyncio.sleep(rng.uniform(*every))
        entries = {
            str(e["name"]): e
            for e in up.state().get("services", [])
            if (kill_sandbox or e["name"] != "sandbox") and (kill_nats or e["name"] != NATS)
        }
        if not round_:
            round_ = sorted(entries)
            rng.shuffle(round_)
        name = round_.pop()
        identity = ProcessIdentity.from_json(entries.get(name, {}).get("identity") or {})
        if identity is not None and identity.signal(signal.SIGKILL):
            report.kills[name] += 1
        else:
            report.missed_kills += 1
            round_.insert(0, name)  # still down from an earlier kill: its turn comes again at the round's end


async def _drain(broker: Broker, ns: Namespace, accepted: set[str], timeout_s: float) -> dict[str, object]:
    journal = RunJournal(broker, ns)
    deadline = time.monotonic() + timeout_s
    terminal: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            for run_id, events in (await journal.read_all()).items():
                if events and isinstance(events[-1], RunCompleted | RunHandedOff):
                    terminal[run_id] = events[-1]
        except CrashsafeError:  # the broker may still be settling after its last restart
            pass
        if accepted <= terminal.keys():
            break
        await asyncio.sleep(0.5)
    return terminal


def _count_effects(entries: list[LedgerEntry], report: ChaosReport) -> None:
    per_key = Counter(e.key for e in entries)
    report.duplicate_effects = sum(n - 1 for n in per_key.values() if n > 1)
    per_run: dict[str, Counter[str]] = {}
    for entry in entries:
        # Keys name business actions, not runs; each soak run has its own guest, so the guest ties them.
        per_run.setdefault(entry.guest_id, Counter())[entry.kind.value] += 1
    for run_id, kinds in per_run.items():
        if kinds["charge"] > 1 or kinds["booking"] > 1:
            report.duplicate_effects += 1
            report.findings.append(f"duplicate: {run_id} {dict(kinds)}")
        kept = kinds["charge"] - kinds["refund"]
        if kept > 0 and kinds["booking"] - kinds["booking_release"] <= 0:
            report.orphan_charges += 1
            report.findings.append(f"orphan charge: {run_id} {dict(kinds)}")
        if kept > 0 and kinds["booking_release"] > 0:
            # The guest pays for a room the agent gave back: the failure the fencing closes.
            report.charges_on_released_rooms += 1
            report.findings.append(f"charge on a released room: {run_id} {dict(kinds)}")


def _projections_per_guest(entries: list[LedgerEntry]) -> dict[str, Counter[str]]:
    """The effects of each guest whose booking stayed paid (kept charge, room not given back)."""
    per_guest: dict[str, Counter[str]] = {}
    for entry in entries:
        per_guest.setdefault(entry.guest_id, Counter())[entry.kind.value] += 1
    return {
        guest: kinds
        for guest, kinds in per_guest.items()
        if kinds["charge"] - kinds["refund"] > 0 and kinds["booking"] - kinds["booking_release"] > 0
    }


async def _settle_projections(listing: SandboxListing, report: ChaosReport, timeout_s: float) -> None:
    """Wait (up to `timeout_s`) for every paid booking's email and CRM record, then count what is missing or
    doubled. Projections are off the runs' path, so they may still be arriving after the last run ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        paid = _projections_per_guest((await _when_back(listing.view)).entries)
        missing = {g: k for g, k in paid.items() if k["email"] < 1 or k["crm_update"] < 1}
        if not missing or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    report.paid_bookings = len(paid)
    report.projections_missing = len(missing)
    report.findings += [f"projection missing: {g} {dict(k)}" for g, k in sorted(missing.items())]
    doubled = {g: k for g, k in paid.items() if k["email"] > 1 or k["crm_update"] > 1}
    report.projections_duplicated = len(doubled)
    report.findings += [f"projection duplicated: {g} {dict(k)}" for g, k in sorted(doubled.items())]


async def _count_dead_projections(broker: Broker, ns: Namespace, report: ChaosReport) -> None:
    """Projections that gave up (their receipts in the KV say dead): none may, a soak's outages are short."""
    try:
        entries = await broker.kv_scan(projections_spec(ns), "projection.>")
    except CrashsafeError as exc:
        report.findings.append(f"projection receipts unreadable: {exc.message}")
        report.projections_dead += 1
        return
    for entry in entries:
        record = record_decoder.decode(entry.value)
        if record.status == ProjectionStatus.DEAD:
            report.projections_dead += 1
            report.findings.append(
                f"projection dead: {record.tool} {record.key} run {record.run_id}: {record.detail}"
            )
