"""`python bench/journal_bytes.py [steps5|booking|all]`: what one run writes and leaves behind, per stream and bucket.

Byte and message counts do not depend on the machine's load, so this is the half of the capacity model
(`docs/capacity.md`) that a busy machine can measure. It starts a real stack, sends warm-up runs, waits for the
stack to go quiet, reads every stream's and KV bucket's state from nats-server's monitoring (`/jsz`), the
executors' SQLite stores and every connection's counters (`/connz`), drives N runs through the gateway, waits for
quiet again (projections delivered, leases aside), reads the same again and prints the difference per run:

- per stream and bucket: messages published to it and their bytes (a listen-only subscription to `>` sees each
  publish: subject, headers and payload), direct gets answered from it, and what it still stores afterwards
  (messages and bytes as JetStream accounts them); a work queue stores nothing once its messages are acked;
- per SQLite store: rows and bytes (pages in use, WAL included);
- per connection: messages and bytes sent to and received from nats-server (the driver's own left out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import socket
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nats.aio.msg import Msg

from bench.driver import JournalWatcher, RawGateway, closed_loop, guest_messages
from bench.probes import nats_traffic
from bench.run import WORKLOADS, note
from bench.wiretap import TappedStack
from bench.workloads import REGISTRY
from crashsafe.contracts.jetstream_api import ACK, API
from crashsafe.contracts.stream_routes import matches
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess
from crashsafe.stack_keys import STACK_TENANT

DIRECT_GET = f"{API}.DIRECT.GET."


def header_bytes(msg: Msg) -> int:
    """The NATS/1.0 header block as it travels (what JetStream stores beside the payload)."""
    if not msg.headers:
        return 0
    return 12 + sum(len(k) + len(v) + 4 for k, v in msg.headers.items()) + 2


@dataclass
class Tap:
    """Publishes to each stream (messages and bytes) and direct gets from it, seen by a subscription to `>`."""

    streams: dict[str, tuple[str, ...]]
    published: Counter[str] = field(default_factory=Counter)
    published_bytes: Counter[str] = field(default_factory=Counter)
    direct_gets: Counter[str] = field(default_factory=Counter)
    messages: int = 0

    def stream_of(self, subject: str) -> str | None:
        for name, subjects in self.streams.items():
            if any(matches(p, subject) for p in subjects):
                return name
        return None

    async def on_msg(self, msg: Msg) -> None:
        self.messages += 1
        if msg.subject.startswith(DIRECT_GET):
            self.direct_gets[msg.subject[len(DIRECT_GET) :].split(".")[0]] += 1
            return
        if (msg.reply or "").startswith(f"{ACK}."):
            return  # a consumer's delivery of a stored message, not a publish
        name = self.stream_of(msg.subject)
        if name is not None:
            self.published[name] += 1
            self.published_bytes[name] += len(msg.subject) + header_bytes(msg) + len(msg.data)


def monitor(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as answer:
        return json.load(answer)


def streams_state(url: str) -> dict[str, dict[str, Any]]:
    """Every stream's config subjects and state (`/jsz`), by name."""
    jsz = monitor(url, "/jsz?streams=true&config=true")
    found: dict[str, dict[str, Any]] = {}
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            found[stream["name"]] = {
                "subjects": tuple(stream.get("config", {}).get("subjects") or ()),
                "messages": int(stream["state"]["messages"]),
                "bytes": int(stream["state"]["bytes"]),
                "last_seq": int(stream["state"]["last_seq"]),
            }
    return found


def connection_bytes(url: str) -> dict[str, tuple[int, int]]:
    """Bytes each connection sent and received so far, by service (replicas summed), as `nats_traffic` names them."""
    totals: dict[str, tuple[int, int]] = {}
    for c in monitor(url, "/connz?limit=4096").get("connections") or []:
        name = str(c.get("name") or "unnamed").split(f"-{socket.gethostname()}-")[0]
        sent, got = totals.get(name, (0, 0))
        totals[name] = (sent + int(c.get("in_bytes", 0)), got + int(c.get("out_bytes", 0)))
    return totals


def sqlite_state(state_dir: Path) -> dict[str, tuple[int, int]]:
    """Each SQLite store's (rows in its main table, bytes in use), read-only, WAL included."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(state_dir.rglob("*.sqlite3")):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            pages = (
                db.execute("PRAGMA page_count").fetchone()[0]
                - db.execute("PRAGMA freelist_count").fetchone()[0]
            )
            size = pages * db.execute("PRAGMA page_size").fetchone()[0]
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            table = "actions" if "actions" in tables else (tables[0] if tables else "")
            rows = db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] if table else 0
        finally:
            db.close()
        found[str(path.relative_to(state_dir))] = (rows, size)
    return found


@dataclass
class Snapshot:
    streams: dict[str, dict[str, Any]]
    sqlite: dict[str, tuple[int, int]]
    messages: dict[str, tuple[int, int]]
    bytes: dict[str, tuple[int, int]]


def snapshot(url: str, state_dir: Path) -> Snapshot:
    return Snapshot(streams_state(url), sqlite_state(state_dir), nats_traffic(url), connection_bytes(url))


async def quiet(url: str, settle_s: float, limit_s: float = 60.0) -> None:
    """Until no stream but the leases' moves for `settle_s` and the work queues are empty (projections delivered)."""
    deadline = time.monotonic() + limit_s
    last: dict[str, int] = {}
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        state = streams_state(url)
        seqs = {n: s["last_seq"] for n, s in state.items() if not n.endswith("_leases") and n != "KV_leases"}
        queued = sum(
            s["messages"]
            for n, s in state.items()
            if n.split("_")[-1] in ("ACTIONS", "OUTCOMES", "PROJECTIONS")
        )
        if seqs != last or queued:
            last, still_since = seqs, time.monotonic()
        elif time.monotonic() - still_since >= settle_s:
            return
        await asyncio.sleep(0.25)
    note(f"not quiet after {limit_s:.0f}s: figures may include work still under way")


def per_run(before: Snapshot, after: Snapshot, tap: Tap, runs: int, elapsed_s: float) -> dict[str, Any]:
    streams = {}
    for name, now in sorted(after.streams.items()):
        was = before.streams.get(name, {"messages": 0, "bytes": 0, "last_seq": 0})
        streams[name] = {
            "published_msgs": tap.published[name] / runs,
            "published_bytes": tap.published_bytes[name] / runs,
            "direct_gets": tap.direct_gets[name] / runs,
            "stored_msgs": (now["messages"] - was["messages"]) / runs,
            "stored_bytes": (now["bytes"] - was["bytes"]) / runs,
        }
    sqlite = {
        name: {
            "rows": (rows - before.sqlite.get(name, (0, 0))[0]) / runs,
            "bytes": (size - before.sqlite.get(name, (0, 0))[1]) / runs,
        }
        for name, (rows, size) in after.sqlite.items()
    }
    connections = {}
    for name, (sent, got) in sorted(after.messages.items()):
        if name.startswith("bench"):
            continue
        sent0, got0 = before.messages.get(name, (0, 0))
        bsent, bgot = after.bytes.get(name, (0, 0))
        bsent0, bgot0 = before.bytes.get(name, (0, 0))
        connections[name] = {
            "msgs_sent": (sent - sent0) / runs,
            "msgs_received": (got - got0) / runs,
            "bytes_sent": (bsent - bsent0) / runs,
            "bytes_received": (bgot - bgot0) / runs,
        }
    return {
        "runs": runs,
        "seconds": elapsed_s,
        "streams": streams,
        "sqlite": sqlite,
        "connections": connections,
        "wire_msgs": tap.messages / runs,
    }


async def measure(
    stack: TappedStack, agent: str, text: str, runs: int, concurrency: int, warmup: int
) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.monitor_port}"
    ns = Namespace(stack.namespace)
    broker = await Broker.connect(
        stack.nats_url, "bench-driver", access=NatsAccess(creds=stack.creds_for("operator"))
    )
    tap_broker = await Broker.connect(stack.nats_url, "bench-wiretap", access=stack.wiretap_access())
    watcher = JournalWatcher(broker, ns)
    raw = RawGateway(stack.gateway_url, agent, stack.api_key)
    prefix = f"bytes-{secrets.token_hex(3)}"
    try:
        await watcher.start()
        await closed_loop(
            watcher, raw.submit, guest_messages(f"{prefix}-w", warmup, text), 10, 60.0, STACK_TENANT
        )
        await quiet(url, settle_s=2.0)
        tap = Tap({n: s["subjects"] for n, s in streams_state(url).items()})
        sub = await tap_broker.nc.subscribe(">", cb=tap.on_msg, pending_msgs_limit=1_000_000)
        before = snapshot(url, stack.state_dir)
        started = time.monotonic()
        result = await closed_loop(
            watcher, raw.submit, guest_messages(prefix, runs, text), concurrency, 60.0, STACK_TENANT
        )
        await quiet(url, settle_s=2.0)
        await tap_broker.nc.flush()
        after = snapshot(url, stack.state_dir)
        await sub.unsubscribe()
        outcomes = Counter(s.outcome for s in result.samples)
        note(f"[{agent}] {runs} runs: {dict(outcomes)}")
        return per_run(before, after, tap, runs, time.monotonic() - started) | {"outcomes": dict(outcomes)}
    finally:
        await raw.aclose()
        for b in (broker, tap_broker):
            try:
                await asyncio.wait_for(b.close(), 5.0)
            except TimeoutError:
                pass


def render(name: str, figures: dict[str, Any]) -> str:
    lines = [
        f"== {name}: per run, {figures['runs']} runs ({figures['outcomes']}); {figures['wire_msgs']:.1f} NATS messages on the wire per run",
        f"{'stream / bucket':<28} {'pub msgs':>9} {'pub bytes':>10} {'direct gets':>12} {'kept msgs':>10} {'kept bytes':>11}",
    ]
    for stream, f in figures["streams"].items():
        if not any(f.values()):
            continue
        lines.append(
            f"{stream:<28} {f['published_msgs']:>9.2f} {f['published_bytes']:>10.0f} {f['direct_gets']:>12.2f} "
            f"{f['stored_msgs']:>10.2f} {f['stored_bytes']:>11.0f}"
        )
    lines += ["", f"{'SQLite store':<40} {'rows':>6} {'bytes':>8}"]
    for store, f in figures["sqlite"].items():
        lines.append(f"{store:<40} {f['rows']:>6.2f} {f['bytes']:>8.0f}")
    lines += [
        "",
        f"{'connection':<22} {'msgs sent':>10} {'msgs recv':>10} {'bytes sent':>11} {'bytes recv':>11}",
    ]
    for conn, f in figures["connections"].items():
        lines.append(
            f"{conn:<22} {f['msgs_sent']:>10.1f} {f['msgs_received']:>10.1f} {f['bytes_sent']:>11.0f} {f['bytes_received']:>11.0f}"
        )
    return "\n".join(lines)


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    workload = WORKLOADS[name]
    state_dir = Path(tempfile.mkdtemp(prefix=f"crashsafe-bytes-{name}-"))
    stack = TappedStack(
        state_dir,
        executors=workload.executors,
        reconciler=workload.reconciler,
        registry=REGISTRY,
        monitor_port=free_port(),
    )
    try:
        stack.start()
        return asyncio.run(
            measure(stack, workload.agent, workload.text, args.runs, args.concurrency, args.warmup)
        )
    finally:
        stack.stop()
        if args.keep:
            note(f"[{name}] kept {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?", default="all", choices=["all", *WORKLOADS])
    parser.add_argument("--runs", type=int, default=500, help="measured runs (default 500)")
    parser.add_argument("--concurrency", type=int, default=50, help="runs in flight (default 50)")
    parser.add_argument("--warmup", type=int, default=20, help="runs before the first reading (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the state dir")
    parser.add_argument("--json", action="store_true", help="figures as JSON on stdout")
    args = parser.parse_args(argv)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    results = {name: run(name, args) for name in names}
    print(
        json.dumps(results, indent=2) if args.json else "\n\n".join(render(n, f) for n, f in results.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
