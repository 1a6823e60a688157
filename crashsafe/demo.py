"""`crashsafe demo` and `crashsafe up`: the stack on an embedded nats-server, one booking, one kill, one charge."""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from crashsafe.contracts.run_events import ActionCompleted, RunCompleted, RunEvent, RunHandedOff, RunStatus
from crashsafe.contracts.tool_messages import Asked
from crashsafe.crash_targets import CRASH_VARIABLE, CrashTargetError, crash_for_up, crash_map
from crashsafe.sandbox.listing import SandboxListing
from crashsafe.services.platform.settings import Settings
from crashsafe.stack import Stack
from crashsafe.stack_env import model_at
from crashsafe.stack_keys import API_KEY_FILE, APPROVER_KEY_FILE, STACK_TENANT, SYNTHETIC_KEY_FILE
from crashsafe.stack_plan import RegistryUnusable, ScaleError, registry_families
from crashsafe.timeline import describe

GUEST_TEXT = "Book a room in Lisbon from 2031-12-01 to 2031-12-03"
_event = msgspec.json.Decoder(RunEvent)


def service_for_seam(seam: str) -> str:
    """Which process a seam kills: executor seams hit the payment executor, where money moves."""
    prefix = seam.split(".", 1)[0]
    return {
        "executor": "executor-payment",
        "runtime": "runtime",
        "gateway": "gateway",
        "reconciler": "reconciler",
        "projector": "projector",
    }[prefix]


async def _post_event(client: httpx.AsyncClient, body: dict[str, str], attempts: int = 20) -> dict[str, Any]:
    """Send the guest message like a careful client: on a dropped connection, retry with the same key."""
    for attempt in range(attempts):
        try:
            response = await client.post("/v1/events", json=body)
            if response.status_code == 202:
                return dict(response.json())
            raise RuntimeError(f"gateway answered {response.status_code}: {response.text}")
        except httpx.TransportError:
            await asyncio.sleep(0.3 + 0.1 * attempt)
    raise RuntimeError("gateway never accepted the event")


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_demo(seam: str, state_dir: Path | None, keep_up: bool = False) -> int:
    console = Console()
    victim = service_for_seam(seam)
    if (unused := Settings.from_env().crash_at) is not None:
        console.print(f"{CRASH_VARIABLE}={unused} not used: the demo's --crash names the seam")
    holder = None
    if state_dir is None:
        holder = tempfile.TemporaryDirectory(prefix="crashsafe-demo-")
        state_dir = Path(holder.name)
    console.print(
        Panel.fit(
            f"[bold]crashsafe demo[/bold]\nA guest asks the booking agent for a room. The [bold]{victim}[/bold] process is told to "
            f"SIGKILL itself at [bold yellow]{seam}[/bold yellow].\nThe supervisor restarts it, as Kubernetes would. "
            "We count what the providers saw.",
        )
    )
    started = time.monotonic()
    stack = Stack(state_dir, crash={victim: seam})
    with console.status("starting nats-server, sandbox, gateway, runtime, executors, reconciler…"):
        await asyncio.to_thread(stack.start)
    console.print(
        f"stack up in {time.monotonic() - started:.1f}s: nats {stack.nats_url}, gateway {stack.gateway_url}, sandbox {stack.sandbox_url}"
    )
    console.print(f"console: {stack.console_url}  (sign in with {stack.api_key})", soft_wrap=True)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    process = stack.services[victim].process
    first_pid = process.pid if process is not None else None
    try:
        async with httpx.AsyncClient(
            base_url=stack.gateway_url, timeout=10, headers={"authorization": f"Bearer {stack.api_key}"}
        ) as client:
            body = {
                "event_id": f"evt-demo-{int(time.time())}",
                "session_id": "sess-ana",
                "guest_id": "guest-ana",
                "text": GUEST_TEXT,
            }
            console.print(f"guest-ana: [italic]“{GUEST_TEXT}”[/italic]")
            accepted = await _post_event(client, body)
            run_id = accepted["run_id"]
            console.print(f"gateway: 202 accepted, run [bold]{run_id}[/bold]")
            console.print(f"         its page: {stack.console_url}runs/{run_id}", soft_wrap=True)
            events = await _follow(console, client, run_id, stack, victim, first_pid, deadline_s=60)
            if keep_up:
                console.print(f"the stack stays up for the console ({stack.console_url}): Ctrl-C stops it")
                await _until_interrupted()
        async with httpx.AsyncClient(base_url=stack.sandbox_url, timeout=10) as sandbox:
            ledger = await SandboxListing(sandbox).view()
    finally:
        stop.set()
        await supervisor
        await asyncio.to_thread(stack.stop)
    for _, event in events:
        if isinstance(event, ActionCompleted) and any(n.asked != Asked.PROVIDER_CALL for n in event.evidence):
            console.print(
                f"[bold yellow]how step {event.step_no} ({event.key}) was settled after the kill:[/]"
            )
            for note in event.evidence:
                console.print(f"  {note.asked:<16} → {note.answer:<8} {note.detail}")
    counts = ledger.counts
    table = Table(title="sandbox ledger (what the providers saw)")
    for column in ("kind", "key", "guest", "amount"):
        table.add_column(column)
    for entry in ledger.entries:
        amount = f"{entry.amount_cents / 100:.2f} {entry.currency or ''}" if entry.amount_cents else ""
        table.add_row(entry.kind.value, entry.key, entry.guest_id, amount)
    console.print(table)
    status = _status(events)
    bookings, charges = counts.get("booking", 0), counts.get("charge", 0)
    ok = bookings == 1 and charges == 1 and status == RunStatus.COMPLETED
    restarted = stack.services[victim].restarts
    verdict = f"{bookings} booking, {charges} charge, run {status}; {victim} was killed at {seam} and restarted {restarted} time(s)"
    console.print(
        Panel.fit(
            ("[bold green]✔ " if ok else "[bold red]✘ ") + verdict + "[/]",
            title=f"done in {time.monotonic() - started:.1f}s",
        )
    )
    if holder is not None:
        holder.cleanup()
    return 0 if ok else 1


def _status(events: list[tuple[int, RunEvent]]) -> RunStatus:
    last = events[-1][1] if events else None
    if isinstance(last, RunCompleted):
        return RunStatus.COMPLETED
    if isinstance(last, RunHandedOff):
        return RunStatus.HANDED_OFF
    return RunStatus.RUNNING


async def _follow(
    console: Console,
    client: httpx.AsyncClient,
    run_id: str,
    stack: Stack,
    victim: str,
    first_pid: int | None,
    deadline_s: float,
) -> list[tuple[int, RunEvent]]:
    """Print each journal event as it lands, and the kill and restart as the supervisor sees them."""
    shown = 0
    announced_kill = False
    deadline = time.monotonic() + deadline_s
    events: list[tuple[int, RunEvent]] = []
    while time.monotonic() < deadline:
        response = await client.get(f"/v1/runs/{run_id}/events")
        if response.status_code == 200:
            raw = response.json()["events"]
            events = [
                (e["seq"], _event.decode(msgspec.json.encode({k: v for k, v in e.items() if k != "seq"})))
                for e in raw
            ]
            for seq, event in events[shown:]:
                step, what, detail = describe(event)
                style = "yellow" if what == "RESUMED" or "RECOVERED" in detail else ""
                console.print(
                    f"  [dim]#{seq}[/dim] step {step or '-':>2} [bold {style}]{what:<10}[/] {detail}"
                )
            shown = len(events)
            if _status(events) != RunStatus.RUNNING:
                return events
        process = stack.services[victim].process
        if not announced_kill and process is not None and process.pid != first_pid:
            announced_kill = True
            console.print(
                f"  [bold red]✝ {victim} (pid {first_pid}) died by SIGKILL[/] — supervisor restarted it as pid {process.pid}"
            )
        await asyncio.sleep(0.1)
    return events


async def run_up(
    state_dir: Path,
    nats_url: str | None,
    scale: dict[str, int] | None = None,
    providers_url: str | None = None,
    model_url: str | None = None,
    *,
    registry: str | None = None,
    crash: list[str] | None = None,
) -> int:
    console = Console()
    try:
        settings = Settings.from_env()
        families = registry_families(registry or settings.registry)
        crashes, crash_notes = crash_for_up(crash or [], settings.crash_at, families)
        stack = Stack(
            state_dir,
            nats_url=nats_url,
            scale=scale,
            providers_url=providers_url,
            model_url=model_url,
            synthetic=True,
            registry=registry,
            crash=crash_map(crashes),
        )
    except (ScaleError, RegistryUnusable, CrashTargetError) as exc:
        console.print(f"[red]crashsafe up: {exc}[/red]")
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.to_thread(stack.start)
    except BaseException:
        await asyncio.to_thread(stack.stop)
        raise
    providers = "sandbox  " if stack.runs_sandbox else "providers"
    model, why = model_at(stack)
    console.print(
        f"nats     {stack.nats_url}\ngateway  {stack.gateway_url}\nconsole  {stack.console_url}"
        f"\n{providers} {stack.sandbox_url}\nmodel    {model} ({why})\nstate    {state_dir / 'stack.json'}"
        f"\napi key  {state_dir / API_KEY_FILE} (admin, tenant {STACK_TENANT}; never approves a run it started)"
        f"\napprover {state_dir / APPROVER_KEY_FILE} (approvals:decide, tenant {STACK_TENANT}: crashsafe approvals"
        " approve, the console's approvals)"
        f"\nprobe    {state_dir / SYNTHETIC_KEY_FILE} (tenant synthetic: crashsafe check synthetic)"
    )
    for note in crash_notes:
        console.print(f"crash    {note}", highlight=False)
    # Where each process answers /healthz, /readyz and /metrics (also `ops_url` per process in stack.json).
    for name in stack.services:
        if (url := stack.ops_url(name)) is not None:
            console.print(f"ops      {name:<20} {url}/metrics", highlight=False)
    await stack.supervise(stop)
    await asyncio.to_thread(stack.stop)
    console.print("stack stopped")
    return 0
