"""`python bench/run.py [booking|steps5|all]`: drives a real stack and prints runs/s, steps/s, latencies and RSS."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Runnable as a script: put the checkout on the path so `bench.*` resolves next to the installed packages.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx

from bench import otlp_sink
from bench.driver import (
    JournalWatcher,
    RawGateway,
    closed_loop,
    gateway_submitter,
    guest_messages,
    jetstream_submitter,
)
from bench.figures import (
    Phase,
    cpu_table,
    messages_table,
    phase_figures,
    phase_table,
    rss_line,
    to_json,
    verdict,
)
from bench.probes import (
    PY_SPY_HINT,
    PySpy,
    cpu_seconds,
    machine_cpu_seconds,
    nats_traffic,
    peak_rss_mb,
    profile_text,
    py_spy_binary,
    summarise,
)
from bench.wiretap import TappedStack, Wiretap
from bench.workloads import REGISTRY
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess
from crashsafe.stack import EXECUTOR_FAMILIES, Stack
from crashsafe.stack_keys import STACK_TENANT

BOOKING_TEXT = "Book a room in Lisbon from 2031-12-01 to 2031-12-03"
RSS_BAR_MB = 100.0


@dataclass(frozen=True)
class Workload:
    name: str
    agent: str
    text: str
    executors: tuple[str, ...]
    reconciler: bool
    runs: int
    concurrency: int
    latency_runs: int  # runs one after another, after the throughput phase; 0 for none
    submit: tuple[str, ...]
    http: str  # the driver's HTTP client for the gateway path: httpx, or raw (cheap enough not to starve the stack)
    bar_runs_per_s: float
    bar_step_p50_ms: float | None


WORKLOADS = {
    "booking": Workload(
        name="booking",
        agent="booking",
        text=BOOKING_TEXT,
        executors=EXECUTOR_FAMILIES,
        reconciler=True,
        runs=500,
        concurrency=50,
        latency_runs=0,
        submit=("gateway",),
        # The driver shares the two cores with the stack: httpx's 3.9 ms of CPU a request (its pool scans every
        # connection per request) took booking from 119.8 to 87.1 runs/s in one hour. `--http httpx` still drives it.
        http="raw",
        bar_runs_per_s=85.0,
        bar_step_p50_ms=None,
    ),
    "steps5": Workload(
        name="steps5",
        agent="steps5",
        text="five no-op steps",
        executors=("noop",),
        # Everything on, as issue 19 measures it and `crashsafe up` runs it: the reconciler follows every journal.
        reconciler=True,
        runs=2000,
        concurrency=50,
        latency_runs=200,
        submit=("gateway", "jetstream"),
        http="raw",
        bar_runs_per_s=420.0,
        bar_step_p50_ms=1.0,
    ),
}


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Report:
    workload: str
    agent: str
    sync_always: bool
    log_level: str
    runtimes: int
    env: list[str]
    phases: list[Phase]
    peak_rss_mb: dict[str, float | None]
    verdict: str
    profiles: list[str]
    untracked_events: int
    http_reconnects: int
    otel: bool = False


async def redelivered(broker: Broker, ns: Namespace) -> dict[str, int]:
    """Messages each consumer has delivered more than once so far (`num_redelivered`): under load, a run that
    waits on a redelivery waits out an ack wait."""
    counts: dict[str, int] = {}
    for kind in (
        StreamKind.INBOUND,
        StreamKind.ACTIONS,
        StreamKind.OUTCOMES,
        StreamKind.RUNS,
        StreamKind.PROJECTIONS,
    ):
        try:
            infos = await broker.js.consumers_info(ns.stream(kind))
        except Exception:  # noqa: BLE001 -- a figure for the report, never a reason to fail the bench
            continue
        for info in infos:
            counts[f"{kind.value}/{info.name}"] = int(info.num_redelivered or 0)
    return counts


async def drive(stack: Stack, workload: Workload, args: argparse.Namespace) -> Report:
    """Warm up, then run each phase against the started stack; returns the workload's report."""
    ns = Namespace(stack.namespace)
    runs = args.runs or workload.runs
    concurrency = args.concurrency or workload.concurrency
    latency_runs = workload.latency_runs if args.latency_runs is None else args.latency_runs
    submit_paths = (
        workload.submit
        if args.submit == "default"
        else ("gateway", "jetstream")
        if args.submit == "both"
        else (args.submit,)
    )
    http = workload.http if args.http == "default" else args.http
    prefix = f"bench-{secrets.token_hex(3)}"
    monitor_url = f"http://127.0.0.1:{stack.monitor_port}" if stack.monitor_port and stack.nats else ""

    broker = await Broker.connect(
        stack.nats_url, "bench-driver", access=NatsAccess(creds=stack.creds_for("operator"))
    )
    tap_broker = (
        await Broker.connect(stack.nats_url, "bench-wiretap", access=stack.wiretap_access())
        if isinstance(stack, TappedStack)
        else None
    )
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    auth = {"authorization": f"Bearer {stack.api_key}"}
    client = httpx.AsyncClient(base_url=stack.gateway_url, limits=limits, timeout=30.0, headers=auth)
    # Throughput phases watch runs end (milestones); latency phases every event, for step timings.
    watchers = {
        "throughput": JournalWatcher(broker, ns, steps=args.step_times),
        "latency": JournalWatcher(broker, ns, steps=True),
    }
    raw = RawGateway(stack.gateway_url, workload.agent, stack.api_key)
    submitters = {
        "gateway": gateway_submitter(client, workload.agent) if http == "httpx" else raw.submit,
        "jetstream": jetstream_submitter(broker, ns, workload.agent, STACK_TENANT),
    }
    labels = {"gateway": f"gateway/{http}", "jetstream": "jetstream"}
    pids = {name: s.process.pid for name, s in stack.services.items() if s.process is not None}
    python_pids = dict(pids) | {"driver": os.getpid()}
    if stack.nats is not None and stack.nats.process is not None:
        pids["nats-server"] = stack.nats.process.pid
    pids["driver"] = os.getpid()

    spy_binary = py_spy_binary() if args.profile else None
    spy = PySpy(spy_binary, Path(args.profile_dir)) if spy_binary else None
    profiles: list[str] = []
    taps: list[str] = []
    phases: list[Phase] = []

    async def phase(name: str, via: str, count: int, width: int, record: bool = True) -> None:
        note(f"[{workload.name}] {name} via {labels[via]}: {count} runs at concurrency {width} ...")
        messages = guest_messages(f"{prefix}-{name}-{via}", count, workload.text)
        profiling = spy is not None and record and name == "throughput"
        tap = Wiretap(tap_broker) if tap_broker is not None and record and name == "latency" else None
        if tap is not None:
            await tap.start()
        if profiling:
            assert spy is not None
            spy.start(f"{workload.name}-{via}", python_pids)
            await asyncio.sleep(1.0)  # let py-spy attach before the load starts
        traffic_before = nats_traffic(monitor_url) if monitor_url else {}
        redelivered_before = await redelivered(broker, ns)
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        machine_before = machine_cpu_seconds()
        watcher = watchers["latency" if name == "latency" else "throughput"]
        await watcher.start()
        try:
            result = await closed_loop(
                watcher, submitters[via], messages, width, args.run_timeout, STACK_TENANT
            )
        finally:
            await watcher.stop()
        used = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
        # Everything else the machine did meanwhile (other users, py-spy, the kernel): a bench on a busy box lies.
        used["not ours"] = max(machine_cpu_seconds() - machine_before - sum(used.values()), 0.0)
        traffic = nats_traffic(monitor_url) if monitor_url else {}
        again = {k: n - redelivered_before.get(k, 0) for k, n in (await redelivered(broker, ns)).items()}
        if record:
            note(
                f"[{workload.name}] {name} via {labels[via]}: messages delivered again (ack wait passed, or nak'd): "
                + (
                    ", ".join(f"{k} {n}" for k, n in sorted(again.items()) if n)
                    or f"none (of {len(again)} consumers)"
                )
            )
        if tap is not None:
            await tap.stop()
            taps.append(f"[{workload.name}] {name} via {labels[via]}: " + tap.table(count))
        messages = {
            name: (sent - traffic_before.get(name, (0, 0))[0], got - traffic_before.get(name, (0, 0))[1])
            for name, (sent, got) in traffic.items()
        }
        if profiling:
            assert spy is not None
            for rec in spy.stop():
                text = profile_text(summarise(f"{workload.name}/{labels[via]}/{rec.name}", rec.path))
                profiles.append(text + f"\n   raw stacks: {rec.path}")
        if not record:
            return
        figures = phase_figures(name, labels[via], width, result.wall_s, result.samples, used, messages)
        phases.append(figures)
        note(
            f"[{workload.name}] {name} via {labels[via]}: {figures.runs_per_s:.1f} runs/s, {figures.steps_per_s:.1f} steps/s, "
            f"run p50 {figures.run_ms.p50:.1f} ms"
            + (f", step p50 {figures.step_ms.p50:.2f} ms " if figures.step_ms.n else " ")
            + f"({figures.completed} completed, {figures.handed_off} handed off, {figures.lost} lost, {figures.rejected} rejected)"
        )

    try:
        if args.warmup:
            await phase("warmup", submit_paths[0], args.warmup, min(concurrency, 10), record=False)
        for via in submit_paths:
            await phase("throughput", via, runs, concurrency)
        if latency_runs:
            for via in submit_paths:
                await phase("latency", via, latency_runs, 1)
        rss = {name: peak_rss_mb(pid) for name, pid in pids.items()}
    finally:
        if spy is not None:
            spy.stop()
        await client.aclose()
        await raw.aclose()
        try:
            await asyncio.wait_for(broker.close(), 5.0)
        except TimeoutError:
            pass  # a drain that cannot finish must not keep the stack up

    return Report(
        workload=workload.name,
        agent=workload.agent,
        sync_always=args.sync_always,
        log_level=args.log_level or "INFO (default)",
        runtimes=args.runtimes,
        env=list(args.env),
        phases=phases,
        peak_rss_mb=rss,
        verdict=verdict(phases, workload.bar_runs_per_s, workload.bar_step_p50_ms, rss, RSS_BAR_MB),
        profiles=profiles + taps,
        untracked_events=sum(w.untracked for w in watchers.values()),
        http_reconnects=raw.retries,
        otel=args.otel,
    )


def run_workload(workload: Workload, args: argparse.Namespace) -> Report:
    """A fresh stack in a fresh state dir for one workload, always stopped and removed afterwards."""
    state_dir = Path(tempfile.mkdtemp(prefix=f"crashsafe-bench-{workload.name}-"))
    env = {"CRASHSAFE_LOG_LEVEL": args.log_level} if args.log_level else {}
    env.update(dict(item.split("=", 1) for item in args.env))
    reconciler = workload.reconciler if args.reconciler is None else args.reconciler
    sink = None
    if args.otel:
        # Spans on, every process exporting them over OTLP/HTTP to a sink that discards them.
        sink, url = otlp_sink.start()
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, **env}
        note(f"[{workload.name}] spans on, exported to {url}")
    stack = (TappedStack if args.wiretap else Stack)(
        state_dir,
        executors=workload.executors,
        reconciler=reconciler,
        sync_always=args.sync_always,
        runtimes=args.runtimes,
        env=env,
        registry=REGISTRY,
        monitor_port=free_port(),
        forking=not args.fresh,
    )
    try:
        started = time.monotonic()
        stack.start()
        note(
            f"[{workload.name}] stack up in {time.monotonic() - started:.1f}s (state {state_dir}, sync_always={args.sync_always})"
        )
        return asyncio.run(drive(stack, workload, args))
    finally:
        stack.stop()
        if sink is not None:
            sink.terminate()
            sink.wait()
        if args.keep:
            note(f"[{workload.name}] kept state and logs in {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


def render(report: Report) -> str:
    sync = "always" if report.sync_always else "default (2 min)"
    env = f", env {' '.join(report.env)}" if report.env else ""
    title = (
        f"== {report.workload} (agent {report.agent}, nats sync_interval {sync}, "
        f"log level {report.log_level}, runtimes {report.runtimes}, spans {'on' if report.otel else 'off'}{env})"
    )
    parts = [title, phase_table(report.phases), "", cpu_table(report.phases), ""]
    parts += [messages_table(report.phases), ""]
    parts += [rss_line(report.peak_rss_mb), report.verdict]
    if report.http_reconnects:
        parts.append(
            f"raw HTTP client: {report.http_reconnects} dropped keep-alive connections retried fresh"
        )
    if report.profiles:
        parts += ["", "profile (py-spy, busy samples only, throughput phases):", *report.profiles]
    return "\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", nargs="?", default="all", choices=["all", *WORKLOADS])
    parser.add_argument(
        "--runs", type=int, default=None, help="runs in the throughput phase (booking 500, steps5 2000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="runs in flight in the throughput phase (default 50)"
    )
    parser.add_argument(
        "--latency-runs",
        type=int,
        default=None,
        help="steps5: runs one after another for latency (default 200; 0 skips)",
    )
    parser.add_argument(
        "--submit",
        choices=["default", "gateway", "jetstream", "both"],
        default="default",
        help="how runs are submitted: HTTP through the gateway, or published straight to JetStream "
        "(default: booking gateway, steps5 both)",
    )
    parser.add_argument(
        "--http",
        choices=["default", "httpx", "raw"],
        default="default",
        help="the driver's HTTP client for the gateway path (default raw: httpx costs ~4 ms of driver CPU per "
        "request, which a 2-core box takes from the services)",
    )
    parser.add_argument(
        "--warmup", type=int, default=20, help="runs before measuring, not counted (default 20)"
    )
    parser.add_argument(
        "--sync-always", action="store_true", help="nats-server fsyncs every write (sync_interval: always)"
    )
    parser.add_argument("--runtimes", type=int, default=1, help="runtime processes (default 1)")
    parser.add_argument(
        "--reconciler",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the reconciler (default: yes, as `crashsafe up` does; --no-reconciler leaves it out)",
    )
    parser.add_argument(
        "--step-times",
        action="store_true",
        help="throughput phases follow every journal event for step timings (default: only each run's end)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="CRASHSAFE_LOG_LEVEL for every service (default: the services' own, INFO)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for every service (repeatable)",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="spans on: every service exports its spans over OTLP/HTTP to a local sink that discards them",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=60.0, help="seconds before a run counts as lost (default 60)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy record every Python service during throughput phases"
    )
    parser.add_argument(
        "--wiretap",
        action="store_true",
        help="count every NATS message of the latency phases by kind (a subscription to '>'): the per-step budget",
    )
    parser.add_argument(
        "--profile-dir",
        default=str(Path(tempfile.gettempdir()) / "crashsafe-bench-profile"),
        help="where raw py-spy stacks go",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary state dir (logs, stores)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="each service in a fresh interpreter, as in a pod, not forked from the warm fork server (whose"
        " preloaded modules every forked service counts in its RSS)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON on stdout (progress stays on stderr)"
    )
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the same path as Ctrl-C: every `finally` stops its stack


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.profile and py_spy_binary() is None:
        note(f"profiling skipped: {PY_SPY_HINT}")
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    reports: list[Report] = []
    for name in names:
        report = run_workload(WORKLOADS[name], args)
        reports.append(report)
        if not args.json:
            print(render(report) + "\n", flush=True)
    if args.json:
        print(json.dumps(to_json(reports), indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        note("interrupted; the stack was stopped")
        sys.exit(130)
