"""The previous release and this tree on one nats-server, rolled forward service by service and back under a
steady stream of booking runs, as a Kubernetes rolling update does it (`maxUnavailable: 0`): each new pod started
and ready before the old one gets SIGTERM, in the order docs/upgrading.md gives (executors, runtime, projector,
reconciler, gateway; back in the same order, so each reader meets the other release's writers both ways; each
direction after its release's own `infra apply`). Approvals wait across each roll: one asked of the previous release and answered by this one,
one asked of this one and answered by the previous release after the rollback.

The previous release is the one contracts/releases.json names before this tree's version, checked out of the
repository's own history into a venv of its own (tests/support/releases.py). What must hold, both ways: every
accepted run ends, completed; each provider saw each run's booking and charge once, and each projection once;
nothing is dead-lettered; every old process drains and exits by itself on SIGTERM; both releases' `crashsafe
audit` find nothing wrong."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashsafe.contracts.release import VERSION, previous_release
from crashsafe.natsd import free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.capability_keys import public_path
from crashsafe.stack import Stack
from crashsafe.stack_keys import STACK_TENANT
from crashsafe.stack_processes import Service
from tests.support.broker import dead_letters
from tests.support.releases import ReleaseInstall, install
from tests.support.stack import StackClient, auth_header, cli_env, crashsafe, open_stack, operator_access
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, CONFIRMED, EFFECTS, effects_per_run

pytestmark = pytest.mark.timeout(600)

# Kubernetes' rolling order (docs/upgrading.md): the receivers of a message before its senders. The executor
# families are independent workloads, rolled at once as `kubectl apply` of the executors' step rolls them.
ROLL_ORDER = (
    ("executor-booking", "executor-payment", "executor-notify", "executor-memory"),
    ("runtime",),
    ("projector",),
    ("reconciler",),
    ("gateway",),
)
SERVICES = [base for step in ROLL_ORDER for base in step]
RUNS_PER_S = 4.0  # the outside check's load: small, since it is the sequence that matters
FOURTEEN_NIGHTS = "Book a room in Lisbon from 2031-06-01 to 2031-06-15"  # over the 1,500.00 approval limit
DRAIN_S = 30.0  # a pod's terminationGracePeriodSeconds: past it, the kubelet kills
# A new pod serves beside the old one this long before the old one is told to go (the manifests'
# minReadySeconds): both releases pull from the same durables, under load, every time.
MIN_READY_S = 2.0


@dataclass
class Gateways:
    """What a Kubernetes Service routes to: the gateways that are ready and not terminating."""

    urls: list[str] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self) -> str:
        return self.urls[next(self._turn) % len(self.urls)]


@dataclass
class Load:
    """A steady stream of bookings, each from a guest of its own, retried by a careful client (same event id) on a
    refusal it may retry: a dropped connection, 503, 429."""

    gateways: Gateways
    http: httpx.AsyncClient
    accepted: dict[str, str] = field(default_factory=dict)  # guest id -> run id
    refused: list[str] = field(default_factory=list)  # answers no careful client retries
    retries: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self) -> None:
        while not self.stop.is_set():
            task = asyncio.create_task(self.book(unique("skew")))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            await asyncio.sleep(1 / RUNS_PER_S)
        await asyncio.gather(*self.pending)

    async def book(self, guest_id: str) -> None:
        body = {"event_id": f"ev-{guest_id}", "session_id": f"s-{guest_id}", "guest_id": guest_id}
        answer = await say(self, {**body, "text": BOOKING_TEXT})
        if answer is not None:
            self.accepted[guest_id] = answer


async def say(load: Load, body: dict[str, str], deadline_s: float = 60.0) -> str | None:
    """POST /v1/events to whichever gateway is routed to, again with the same body until it is taken: its run id."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            response = await load.http.post(f"{load.gateways.pick()}/v1/events", json=body)
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code == 202:
            return str(response.json()["run_id"])
        if response is not None and response.status_code not in (429, 503):
            load.refused.append(f"{body['event_id']}: {response.status_code} {response.text[:200]}")
            return None
        load.retries += 1
        await asyncio.sleep(0.2)
    load.refused.append(f"{body['event_id']}: never taken in {deadline_s:.0f}s")
    return None


@dataclass
class Roll:
    """The pods of a stack as releases: each service's live pod, replaced one at a time by another release's."""

    stack: Stack
    gateways: Gateways
    generation: int = 0
    exits: dict[str, int | None] = field(
        default_factory=dict
    )  # a retired pod -> its exit code (None: killed)

    def live(self, base: str) -> Service:
        [service] = [s for s in self.stack.replicas(base) if not s.stopped]
        return service

    async def to(self, python: str, after: dict[str, Callable[[], Awaitable[None]]] | None = None) -> None:
        """Every service replaced, a step of ROLL_ORDER at a time; `after[base]` runs once the step that replaced
        `base` is done (the operator's look)."""
        self.generation += 1
        for step in ROLL_ORDER:
            await asyncio.gather(*(self.replace(base, python) for base in step))
            for base in step:
                if after and base in after:
                    await after[base]()

    async def replace(self, base: str, python: str) -> None:
        old = self.live(base)
        name = f"{base}-g{self.generation}"
        env = {"CRASHSAFE_GATEWAY_PORT": str(free_port())} if base == "gateway" else {}
        self.stack.services[name] = Service(name=name, args=list(old.args), base=base, python=python, env=env)
        self.stack.spawn(name)
        if base == "gateway":
            url = f"http://127.0.0.1:{env['CRASHSAFE_GATEWAY_PORT']}"
            await eventually(lambda: _ready(url), what=f"{name} ready at {url}", timeout_s=60)
            old_url = self.gateways.urls[0]
            self.gateways.urls.append(url)
            self.gateways.urls.remove(old_url)  # a terminating pod leaves the Service's endpoints
        else:
            await asyncio.to_thread(self.stack.wait_ready, name, 60.0)
        await asyncio.sleep(MIN_READY_S)
        await self.retire(old)

    async def retire(self, service: Service) -> None:
        """SIGTERM, as the kubelet sends it, and the grace period to drain in; past it, SIGKILL."""
        service.stopped = True
        process = service.process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_S
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if process.poll() is None:
            process.kill()
            process.wait()
            self.exits[service.name] = None
        else:
            self.exits[service.name] = process.returncode


async def _ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1.0) as http:
            return (await http.get(f"{url}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def _summary(client: StackClient, gateways: Gateways, run_id: str) -> dict[str, Any] | None:
    try:
        response = await client.gateway.get(f"{gateways.pick()}/v1/runs/{run_id}")
    except httpx.TransportError:
        return None
    return dict(response.json()) if response.status_code == 200 else None


async def _awaiting_approval(client: StackClient, gateways: Gateways, run_id: str) -> str | None:
    summary = await _summary(client, gateways, run_id)
    return summary.get("awaiting_approval") if summary else None


async def _operator(stack: Stack, python: str, *args: str) -> tuple[int, str]:
    """`crashsafe ARGS` of the release installed at `python`, as the operator (its credential, the stack's NATS),
    run outside any checkout; its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "crashsafe.cli",
        *args,
        env={**os.environ, **cli_env(stack)},
        cwd=stack.state_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def _infra_apply(stack: Stack, python: str) -> None:
    """The operator's first step of a rollout: the release's own provisioning, additive."""
    code, out = await _operator(stack, python, "infra", "apply")
    assert code == 0, out


async def _says(stack: Stack, expected_code: int, expected: str, *args: str) -> None:
    """This release's operator command answers `expected_code` and says `expected`."""
    code, out = await _operator(stack, sys.executable, *args, "--state-dir", str(stack.state_dir / "op"))
    assert code == expected_code and expected in out, f"crashsafe {' '.join(args)}: {code} {out}"


class ApprovalAcross:
    """A guest whose stay waits for their own approval while a roll goes by, then says yes."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.guest_id = unique("approver")
        self.run_id = ""

    async def ask(self, client: StackClient) -> None:
        await crashsafe(
            "guests",
            "set",
            self.guest_id,
            "--tenant",
            STACK_TENANT,
            "--verified-email",
            f"{self.guest_id}@guests.example",
            "--state-dir",
            str(client.stack.state_dir / "operator"),
            env=cli_env(client.stack),
        )
        body = {
            "event_id": f"ev-{self.guest_id}-1",
            "session_id": f"s-{self.guest_id}",
            "guest_id": self.guest_id,
        }
        run_id = await say(self.load, {**body, "text": FOURTEEN_NIGHTS})
        assert run_id is not None, self.load.refused
        self.run_id = run_id
        await eventually(
            lambda: _awaiting_approval(client, self.load.gateways, run_id),
            what=f"run {run_id} to wait for the guest's approval",
        )

    async def answer(self) -> None:
        body = {
            "event_id": f"ev-{self.guest_id}-2",
            "session_id": f"s-{self.guest_id}",
            "guest_id": self.guest_id,
        }
        assert await say(self.load, {**body, "text": "yes"}) == self.run_id, self.load.refused


async def test_a_rolling_upgrade_to_this_release_and_back_loses_nothing(tmp_path: Path) -> None:
    previous = previous_release()
    assert previous is not None, f"contracts/releases.json names no release before {VERSION}"
    old: ReleaseInstall = await asyncio.to_thread(install, previous)
    new = sys.executable
    async with open_stack(tmp_path / "stack", nats_url=None, python=old.python, forking=False) as client:
        stack = client.stack
        gateways = Gateways([stack.gateway_url])
        http = httpx.AsyncClient(timeout=20.0, headers=auth_header(stack.api_key))
        load = Load(gateways, http)
        roll = Roll(stack, gateways)
        try:
            first, second = ApprovalAcross(load), ApprovalAcross(load)
            await first.ask(client)
            driving = asyncio.create_task(load.run())
            await asyncio.sleep(2)  # the previous release alone under load, before any pod is replaced

            await _says(stack, 0, f"compatible: {VERSION} runs beside", "upgrade", "check")
            started = time.monotonic()
            await _infra_apply(stack, new)
            # Half-way, the previous release's runtime still pulls: no contracting step may run.
            await roll.to(
                new,
                after={
                    "executor-memory": lambda: _says(
                        stack, 1, "older processes are alive", "infra", "contract"
                    )
                },
            )
            forward_s = time.monotonic() - started
            await _says(
                stack, 0, f"converged on {VERSION} ({len(SERVICES)} process(es))", "upgrade", "status"
            )
            await first.answer()
            await second.ask(client)

            started = time.monotonic()
            await _infra_apply(stack, old.python)  # a rollback applies the previous release's own config too
            # Back in the same order, not the reverse docs/upgrading.md advises: forward, every reader is new
            # before its writers are (N+1 reads N); back in this order, every reader is old again while its writers
            # are still new (N reads N+1). Reversed, the rollback would only try the first again.
            await roll.to(old.python)
            back_s = time.monotonic() - started
            # Rolled back: the previous release runs again, and nothing may be contracted under it.
            await _says(stack, 1, "older processes are alive", "infra", "contract")
            await second.answer()
            await asyncio.sleep(2)
            load.stop.set()
            await driving
            assert not load.refused, load.refused

            runs = {**load.accepted, first.guest_id: first.run_id, second.guest_id: second.run_id}
            broker = await Broker.connect(stack.nats_url, "skew-test", access=operator_access(stack))
            try:
                for run_id in runs.values():
                    try:
                        summary = await eventually(
                            lambda r=run_id: _ended(client, gateways, r),
                            what=f"run {run_id} to end",
                            timeout_s=120,
                        )
                    except AssertionError as exc:
                        letters = [
                            (d.service, d.code, d.reason) for d in await dead_letters(broker, client.ns)
                        ]
                        raise AssertionError(f"{exc}; dead letters: {letters[:5]} ({len(letters)})") from None
                    assert summary["status"] == "completed", summary
                ledger = await eventually(
                    lambda: _all_projected(client, len(runs)),
                    what="every run's booking, charge, email and CRM record",
                    timeout_s=120,
                )
                per_run = effects_per_run(ledger["entries"], dict(runs))
                wrong = {
                    run: kinds
                    for run, kinds in per_run.items()
                    if {k: kinds.get(k, 0) for k in EFFECTS} != {k: CONFIRMED[k] for k in EFFECTS}
                }
                assert not wrong and set(per_run) == set(runs.values()), wrong
                assert await dead_letters(broker, client.ns) == []
            finally:
                await broker.close()
            assert all(code == 0 for code in roll.exits.values()), roll.exits
            for python, label in ((new, VERSION), (old.python, previous.version)):
                code, out = await _operator(
                    stack, python, "audit", "--state-dir", str(tmp_path / f"audit-{label}")
                )
                assert code == 0 and "nothing wrong" in out, f"{label}'s audit: {out[-3000:]}"
            # Runs that moved between releases: never tampered (a run whose end came after the rollback has no
            # checkpoint over it, incomplete: exit 3), and the checkpoint stream whole across the roll.
            pinned = str(public_path(stack.capability_key))
            code, out = await _operator(
                stack, new, "verify", "--live", "--trust", pinned, "--state-dir", str(tmp_path / "verify")
            )
            assert code in (0, 3) and "tampered" not in out and " 0 breaks" in out, out[-3000:]
            print(
                f"version skew {previous.version} -> {VERSION} -> {previous.version}: {len(runs)} runs accepted"
                f" and completed, {load.retries} retried refusals, forward {forward_s:.1f}s, back {back_s:.1f}s,"
                f" exits {roll.exits}; verify --live: {out.strip().splitlines()[-1]}"
            )
        finally:
            load.stop.set()
            for task in list(load.pending):
                task.cancel()
            await asyncio.gather(*load.pending, return_exceptions=True)
            await http.aclose()


async def _ended(client: StackClient, gateways: Gateways, run_id: str) -> dict[str, Any] | None:
    summary = await _summary(client, gateways, run_id)
    return summary if summary is not None and summary["status"] != "running" else None


async def _all_projected(client: StackClient, runs: int) -> dict[str, Any] | None:
    ledger = await client.ledger()
    counts = ledger["counts"]
    return ledger if all(counts.get(k, 0) >= runs * CONFIRMED[k] for k in EFFECTS) else None
