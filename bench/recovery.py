"""Recovery time: 100 runs in flight with 100 ms steps, a worker SIGKILLed; how long until all of them complete."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.workloads import REGISTRY
from crashsafe.contracts.run_events import ActionRequested, RunCompleted, RunHandedOff, event_decoder
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess, Settings
from crashsafe.stack import Stack

AGENT = "steps5x100ms"


async def _submit(stack: Stack, n: int) -> set[str]:
    auth = {"authorization": f"Bearer {stack.api_key}"}
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=30, headers=auth) as client:

        async def one(i: int) -> str:
            body = {
                "event_id": f"rec-{uuid.uuid4().hex}",
                "session_id": f"s{i}",
                "guest_id": f"g{i}",
                "text": "go",
            }
            response = await client.post(f"/v1/events?agent={AGENT}", json=body)
            response.raise_for_status()
            return str(response.json()["run_id"])

        return set(await asyncio.gather(*(one(i) for i in range(n))))


async def scenario(name: str, runs: int, ack_wait_s: float) -> dict[str, object]:
    """`restart`: the only runtime is killed and restarted. `replica`: one of two runtimes is killed, not restarted.
    `executor`: the executor is killed and restarted. `none`: no kill (the baseline of inherent remaining work)."""
    with tempfile.TemporaryDirectory(prefix="crashsafe-recovery-") as tmp:
        state = Path(os.environ.get("CRASHSAFE_BENCH_DIR") or tmp) / name
        stack = Stack(
            state,
            executors=("noop",),
            runtimes=2 if name == "replica" else 1,
            reconciler=False,
            env={"CRASHSAFE_ACK_WAIT_S": str(ack_wait_s)},
            registry=REGISTRY,
        )
        await asyncio.to_thread(stack.start)
        broker = await Broker.connect(
            stack.nats_url, "bench-recovery", access=NatsAccess(creds=stack.creds_for("operator"))
        )
        started: set[str] = set()
        done: set[str] = set()
        finished_at: dict[str, float] = {}  # each run's end, by the monotonic clock
        all_started = asyncio.Event()
        all_done = asyncio.Event()

        async def watch(msg) -> None:  # type: ignore[no-untyped-def]
            event = event_decoder.decode(msg.data)
            if isinstance(event, ActionRequested):
                started.add(event.run_id)
                if len(started) >= runs:
                    all_started.set()
            elif isinstance(event, RunCompleted | RunHandedOff):
                done.add(event.run_id)
                finished_at.setdefault(event.run_id, time.monotonic())
                if len(done) >= runs:
                    all_done.set()

        await broker.nc.subscribe(Namespace(stack.namespace).run_events_all, cb=watch)
        try:
            await _submit(stack, runs)
            await asyncio.wait_for(all_started.wait(), 60)
            # Counted at the kill, not once the new process is ready: runs it settles while it starts are caught too.
            in_flight = runs - len(done)
            waiting = started - done  # the runs the kill caught
            t_kill = time.monotonic()
            victim = {"restart": "runtime", "replica": "runtime-0", "executor": "executor-noop"}.get(name)
            t_ready = t_kill
            if victim:
                stack.kill(victim)
                if name != "replica":
                    await asyncio.to_thread(
                        stack.restart, victim
                    )  # returns once the new process says it is ready
                    t_ready = time.monotonic()
            await asyncio.wait_for(all_done.wait(), 120)
            t_end = time.monotonic()
        finally:
            await broker.close()
            await asyncio.to_thread(stack.stop)
    # Per run caught by the kill: from the new process ready (or the kill, with a replica alive) to its end. The
    # last run alone can be a rule at work (an unknown outcome told at the delivery cap), not the recovery.
    after = sorted(max(finished_at[r] - t_ready, 0.0) for r in waiting if r in finished_at)
    return {
        "scenario": name,
        "ready_to_run_done_p50_s": round(_at(after, 0.50), 3),
        "ready_to_run_done_p95_s": round(_at(after, 0.95), 3),
        "runs_over_1s": sum(1 for a in after if a > 1.0),
        "runs_over_5s": sum(1 for a in after if a > 5.0),
        "runs_in_flight_at_kill": in_flight,
        "ack_wait_s": ack_wait_s,
        "kill_to_all_done_s": round(t_end - t_kill, 3),
        "restart_ready_s": round(t_ready - t_kill, 3),
        "ready_to_all_done_s": round(t_end - t_ready, 3),
    }


def _at(ordered: list[float], q: float) -> float:
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument(
        "--ack-wait", type=float, default=Settings.ack_wait_s, help="(default: the product's)"
    )
    parser.add_argument("--scenarios", default="none,restart,replica,executor")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for name in args.scenarios.split(","):
        result = asyncio.run(scenario(name, args.runs, args.ack_wait))
        print(
            json.dumps(result) if args.json else "  ".join(f"{k}={v}" for k, v in result.items()), flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
