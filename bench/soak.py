"""The chaos soak: booking runs while random services and the nats-server are SIGKILLed; then count what broke."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from contracts.errors import CrashsafeError
from contracts.run_events import RunCompleted, RunHandedOff
from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from services.platform.journal import RunJournal
from services.platform.settings import Settings
from crashsafe.stack import Stack
from sandbox.listing import SandboxListing
from sandbox.records import LedgerEntry
from services.agents import stayhub
from services.platform.providers import Providers
from services.reconciler.service import audit_all

BOOKING = "Book a room in {city} from 2026-12-{d1:02d} to 2026-12-{d2:02d}"
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
    audit_findings: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    drain_s: float = 0.0
    total_s: float = 0.0
    handoff_reasons: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate_effects == 0
            and self.orphan_charges == 0
            and self.audit_findings == 0
        )

    def lines(self) -> list[str]:
        kills = ", ".join(f"{name} {n}" for name, n in sorted(self.kills.items()))
        return [
            f"runs submitted {self.runs_submitted}, accepted {self.runs_accepted}",
            f"completed {self.completed}, handed off {self.handed_off} {dict(self.handoff_reasons) or ''}",
            f"lost {self.lost} (must be 0), duplicate effects {self.duplicate_effects} (must be 0), orphan charges {self.orphan_charges} (must be 0)",
            f"audit findings {self.audit_findings} (must be 0)",
            f"kills: {kills}",
            f"drained {self.drain_s:.1f}s after the last kill; {self.total_s:.1f}s in all",
        ] + [f"  {f}" for f in self.findings[:20]]


async def soak(
    state_dir: Path,
    runs: int = 300,
    duration_s: float = 60.0,
    kill_every_s: tuple[float, float] = (1.0, 3.0),
    drain_timeout_s: float = 240.0,
    seed: int | None = None,
    kill_nats: bool = True,
) -> ChaosReport:
    rng = random.Random(seed)
    report = ChaosReport()
    started = time.monotonic()
    stack = Stack(state_dir, env={"CRASHSAFE_ACK_WAIT_S": "1"})
    await asyncio.to_thread(stack.start)
    stop_supervisor = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop_supervisor))
    broker = await Broker.connect(stack.nats_url, "chaos")
    accepted: set[str] = set()
    try:
        submitter = asyncio.create_task(_submit_all(stack, runs, duration_s, rng, accepted, report))
        await _kill_loop(stack, duration_s, kill_every_s, rng, report, kill_nats)
        last_kill = time.monotonic()
        await submitter
        report.runs_accepted = len(accepted)
        terminal = await _drain(broker, stack, accepted, drain_timeout_s)
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
        async with Providers.connect(stack.sandbox_url) as providers:
            listing = SandboxListing(providers.http)
            _count_effects((await listing.view()).entries, report)
            settings = Settings(
                nats_url=stack.nats_url, namespace=Namespace(stack.namespace), sandbox_url=stack.sandbox_url
            )
            findings, _ = await audit_all(broker, settings, stayhub(), providers, listing)
        report.audit_findings = len(findings)
        report.findings += [f"audit: {f.kind} {f.key}: {f.detail}" for f in findings]
    finally:
        await broker.close()
        stop_supervisor.set()
        await supervisor
        await asyncio.to_thread(stack.stop)
    report.total_s = time.monotonic() - started
    return report


async def _submit_all(
    stack: Stack, runs: int, duration_s: float, rng: random.Random, accepted: set[str], report: ChaosReport
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
        async with slots, httpx.AsyncClient(base_url=stack.gateway_url, timeout=5) as client:
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
    stack: Stack,
    duration_s: float,
    every: tuple[float, float],
    rng: random.Random,
    report: ChaosReport,
    kill_nats: bool,
) -> None:
    victims = [name for name in stack.services if name != "sandbox"] + (["nats-server"] if kill_nats else [])
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        await asyncio.sleep(rng.uniform(*every))
        victim = rng.choice(victims)
        report.kills[victim] += 1
        if victim == "nats-server":
            assert stack.nats is not None
            stack.nats.kill()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await asyncio.to_thread(stack.nats.start)
        else:
            stack.kill(victim)  # the supervisor restarts it after its back-off


async def _drain(broker: Broker, stack: Stack, accepted: set[str], timeout_s: float) -> dict[str, object]:
    journal = RunJournal(broker, Namespace(stack.namespace))
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
        per_run.setdefault(entry.key.split(":", 1)[0], Counter())[entry.kind.value] += 1
    for run_id, kinds in per_run.items():
        if kinds["charge"] > 1 or kinds["booking"] > 1:
            report.duplicate_effects += 1
            report.findings.append(f"duplicate: {run_id} {dict(kinds)}")
        kept = kinds["charge"] - kinds["refund"]
        if kept > 0 and kinds["booking"] - kinds["booking_release"] <= 0:
            report.orphan_charges += 1
            report.findings.append(f"orphan charge: {run_id} {dict(kinds)}")
