"""The `crashsafe` command: serve any one service, run the demo, bring the stack up or down, inspect runs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from services.platform.crashpoints import SEAMS

DEFAULT_STATE_DIR = Path(".crashsafe")


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _ready(name: str) -> None:
    print(f"ready: {name}", flush=True)


async def _serve(args: argparse.Namespace) -> None:
    from services.platform.logs import configure
    from services.platform.settings import Settings

    settings = Settings.from_env()
    stop = _stop_event()
    match args.service:
        case "sandbox":
            from sandbox.app import serve

            await serve(host="127.0.0.1", port=settings.sandbox_port)
        case "gateway":
            from services.gateway.app import serve_gateway

            configure("gateway")
            await serve_gateway(settings)
        case "runtime":
            from services.platform.jetstream import Broker
            from services.runtime.model import ResponsesModel
            from services.runtime.service import Runtime

            logger = configure("runtime")
            model = ResponsesModel(settings.openai_base_url, settings.openai_api_key, settings.model)
            broker = await Broker.connect(settings.nats_url, f"runtime-{settings.worker_id}")
            runtime = Runtime(broker, settings, model, logger)
            await runtime.start()
            _ready("runtime")
            await stop.wait()
            await runtime.deliveries.drain()
            await model.close()
            await broker.close()
        case "executor":
            from services.executor.service import Executor, parse_partitions
            from services.platform.jetstream import Broker

            if not args.tool:
                sys.exit("crashsafe serve executor needs --tool FAMILY (booking, payment, notify, noop)")
            logger = configure(f"executor.{args.tool}")
            partitions = parse_partitions(
                args.partitions or os.environ.get("CRASHSAFE_PARTITIONS", "all"), settings.partitions
            )
            broker = await Broker.connect(settings.nats_url, f"executor-{args.tool}-{settings.worker_id}")
            from services.executor.providers import provider_client

            async with provider_client(settings.sandbox_url) as http:
                executor = Executor(
                    broker,
                    settings,
                    args.tool,
                    partitions,
                    http,
                    logger,
                    os.environ.get("CRASHSAFE_SQLITE_SYNC", "NORMAL"),
                )
                await executor.start()
                _ready(f"executor {args.tool}")
                await stop.wait()
                await executor.close()
            await broker.close()
        case "reconciler":
            from services.platform.jetstream import Broker
            from services.reconciler.service import Reconciler

            logger = configure("reconciler")
            broker = await Broker.connect(settings.nats_url, f"reconciler-{settings.worker_id}")
            reconciler = Reconciler(broker, settings, logger)
            await reconciler.start()
            _ready("reconciler")
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                except TimeoutError:
                    await reconciler.tick()
            await broker.close()


def _settings_for(state_dir: str) -> Any:
    """Settings from the environment, filled in from a running stack's stack.json where the environment is silent."""
    from contracts.subjects import Namespace
    from services.platform.settings import Settings

    stack = _stack_file(Path(state_dir))
    settings = Settings.from_env()
    overrides: dict[str, Any] = {}
    if "CRASHSAFE_NATS_URL" not in os.environ and stack.get("nats_url"):
        overrides["nats_url"] = str(stack["nats_url"])
    if "CRASHSAFE_NAMESPACE" not in os.environ and stack.get("namespace"):
        overrides["namespace"] = Namespace(str(stack["namespace"]))
    if "CRASHSAFE_SANDBOX_URL" not in os.environ and stack.get("sandbox_url"):
        overrides["sandbox_url"] = str(stack["sandbox_url"])
    return dataclasses.replace(settings, **overrides)


async def _reconcile(args: argparse.Namespace) -> int:
    from services.platform.jetstream import Broker
    from services.platform.journal import RunJournal
    from services.reconciler.service import reconcile_run
    from services.runtime.core.fold import replay

    settings = _settings_for(args.state_dir)
    broker = await Broker.connect(settings.nats_url, "crashsafe-reconcile")
    try:
        if args.run_id:
            run_ids = [args.run_id]
        else:
            journals = await RunJournal(broker, settings.namespace).read_all()
            run_ids = [
                run_id
                for run_id, events in journals.items()
                if (s := replay(events)) is not None and not s.terminal
            ]
        for run_id in run_ids:
            done = await reconcile_run(broker, settings, run_id, by="operator:cli")
            asked = ", ".join(done.asked) or "nothing open"
            print(f"{run_id}: {done.status}; asked to resolve: {asked}")
        if not run_ids:
            print("no open runs")
    finally:
        await broker.close()
    return 0


async def _audit(args: argparse.Namespace) -> int:
    import httpx

    from services.platform.jetstream import Broker
    from services.reconciler.service import audit_all

    settings = _settings_for(args.state_dir)
    broker = await Broker.connect(settings.nats_url, "crashsafe-audit")
    try:
        async with httpx.AsyncClient(base_url=settings.sandbox_url, timeout=10) as http:
            findings, stats = await audit_all(broker, settings, http)
    finally:
        await broker.close()
    print(
        f"audited {stats['runs']} runs, {stats['keyed_intents']} keyed intents ({stats['looked_up']} looked up), {stats['ledger_entries']} provider effects"
    )
    for finding in findings:
        print(f"WRONG {finding.kind}: run {finding.run_id} key {finding.key}: {finding.detail}")
    if not findings:
        print(
            "nothing wrong: every effect has one journaled intent and every journaled success has its effect"
        )
    return 1 if findings else 0


def _stack_file(state_dir: Path) -> dict[str, object]:
    path = state_dir / "stack.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


async def _runs_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from contracts.subjects import Namespace
    from services.platform.jetstream import Broker
    from services.platform.journal import RunJournal
    from services.runtime.core.fold import replay, summarize
    from crashsafe.timeline import timeline

    stack = _stack_file(Path(args.state_dir))
    url = os.environ.get("CRASHSAFE_NATS_URL") or str(stack.get("nats_url") or "nats://127.0.0.1:4222")
    ns = Namespace(os.environ.get("CRASHSAFE_NAMESPACE") or str(stack.get("namespace") or "crashsafe"))
    broker = await Broker.connect(url, "crashsafe-cli")
    try:
        events = await RunJournal(broker, ns).read_with_seqs(args.run_id)
    finally:
        await broker.close()
    console = Console()
    if not events:
        console.print(f"[red]no run {args.run_id}[/red] in namespace {ns.name} at {url}")
        return 1
    if args.json:
        import msgspec

        for seq, event in events:
            print(json.dumps({"seq": seq, **msgspec.to_builtins(event)}))
        return 0
    console.print(timeline(events, title=f"run {args.run_id}"))
    state = replay(e for _, e in events)
    assert state is not None
    s = summarize(state)
    console.print(f"status [bold]{s.status}[/bold], {s.steps} steps, {s.tokens_used} tokens")
    return 0


def _down(args: argparse.Namespace) -> int:
    stack = _stack_file(Path(args.state_dir))
    pid = stack.get("supervisor_pid")
    if not pid:
        print(f"no running stack recorded in {args.state_dir}/stack.json")
        return 1
    try:
        os.kill(int(str(pid)), signal.SIGTERM)
    except ProcessLookupError:
        print(f"supervisor {pid} is gone; stopping what it recorded")
        for service in stack.get("services", []):  # type: ignore[union-attr]
            try:
                os.kill(int(service["pid"]), signal.SIGTERM)
            except (ProcessLookupError, TypeError):
                pass
    print("stack stopping")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crashsafe", description="A crash-safe runtime for AI agents on NATS JetStream."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service in the foreground (as a container would)")
    serve.add_argument("service", choices=["gateway", "runtime", "executor", "reconciler", "sandbox"])
    serve.add_argument("--tool", help="tool family for an executor: booking, payment, notify, noop")
    serve.add_argument("--partitions", help="key partitions this executor owns: all, 0-3, 0,2 (default all)")

    demo = sub.add_parser("demo", help="run the booking with a worker killed at the worst moment")
    demo.add_argument(
        "--crash", choices=SEAMS, default="executor.after_provider_ack", help="the seam to SIGKILL at"
    )
    demo.add_argument(
        "--state-dir", default=None, help="keep the demo's data here (default: a temporary dir)"
    )

    up = sub.add_parser("up", help="start the whole stack and supervise it")
    up.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    up.add_argument("--nats-url", default=None, help="use this NATS instead of an embedded nats-server")

    down = sub.add_parser("down", help="stop a stack started with `up`")
    down.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    show = runs_sub.add_parser("show", help="a run's journal as a timeline")
    show.add_argument("run_id")
    show.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    show.add_argument("--json", action="store_true", help="print the events as JSON lines")

    reconcile = sub.add_parser(
        "reconcile", help="resolve open actions by key and wake runs (one run, or every open run)"
    )
    reconcile.add_argument("run_id", nargs="?")
    reconcile.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    audit = sub.add_parser(
        "audit", help="cross-check every run's journal against the providers; prints disagreements"
    )
    audit.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))

    infra = sub.add_parser("infra", help="declare streams and consumers")
    infra_sub = infra.add_subparsers(dest="infra_command", required=True)
    infra_sub.add_parser("apply", help="create or update every stream (idempotent)")
    return parser


async def _infra_apply() -> int:
    from contracts.streams import stream_specs
    from services.platform.jetstream import Broker
    from services.platform.settings import Settings

    settings = Settings.from_env()
    broker = await Broker.connect(settings.nats_url, "crashsafe-infra")
    for spec in stream_specs(settings.namespace, settings.stream_replicas):
        await broker.ensure_stream(spec)
        print(f"stream {spec.name}: {', '.join(spec.subjects)}")
    await broker.close()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    match args.command:
        case "serve":
            asyncio.run(_serve(args))
        case "demo":
            from crashsafe.demo import run_demo

            sys.exit(asyncio.run(run_demo(args.crash, Path(args.state_dir) if args.state_dir else None)))
        case "up":
            from crashsafe.demo import run_up

            sys.exit(asyncio.run(run_up(Path(args.state_dir), args.nats_url)))
        case "down":
            sys.exit(_down(args))
        case "runs":
            sys.exit(asyncio.run(_runs_show(args)))
        case "infra":
            sys.exit(asyncio.run(_infra_apply()))
        case "reconcile":
            sys.exit(asyncio.run(_reconcile(args)))
        case "audit":
            sys.exit(asyncio.run(_audit(args)))


if __name__ == "__main__":
    main()
