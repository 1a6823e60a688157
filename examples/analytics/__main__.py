"""`python -m crashsafe.examples.analytics --creds F --url U`: bookings and revenue per hour, as a table or JSON lines."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import msgspec

from crashsafe.contracts.subjects import DEFAULT_NAMESPACE, Namespace
from crashsafe.examples.analytics.consumer import DEFAULT_DURABLE, AnalyticsError, Consumer, connect
from crashsafe.examples.analytics.core import Figures, Row, rows, totals


def _money(cents: dict[str, int]) -> str:
    return ", ".join(f"{v / 100:,.2f} {c}" for c, v in cents.items()) or "-"


def render(figures: Figures, as_json: bool) -> str:
    lines: list[str] = []
    table = [*rows(figures), totals(figures)]
    if as_json:
        return "\n".join(msgspec.json.encode(r).decode() for r in table)
    header = ("hour", "bookings", "released", "payments", "declined", "refunds", "revenue")
    body = [_cells(r) for r in table]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    for cells in [header, *body]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    if figures.undecodable or figures.unknown:
        lines.append(
            f"skipped {figures.unknown} event(s) of unknown types, {figures.undecodable} undecodable deliveries"
        )
    return "\n".join(lines)


def _cells(r: Row) -> tuple[str, ...]:
    counts = (r.bookings, r.released, r.payments, r.declined, r.refunds)
    return (r.hour, *(str(n) for n in counts), _money(r.revenue_cents))


async def run(args: argparse.Namespace) -> int:
    ns = Namespace(args.namespace)
    nc = await connect(args.url, Path(args.creds) if args.creds else None)
    state = Path(args.state) if args.state else Path(f"analytics-{ns.name}-{args.durable}.json")
    consumer = Consumer(nc, ns, args.durable, state, args.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await consumer.open()
        if not args.follow:
            await consumer.drain()
            print(render(consumer.figures, args.json))
            return 0
        while not stop.is_set():
            if await consumer.step(wait_s=1.0):
                print(render(consumer.figures, args.json), flush=True)
        return 0
    finally:
        await consumer.close()
        await nc.drain()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m crashsafe.examples.analytics",
        description="Bookings and revenue per hour from crashsafe run events (a durable consumer on <NS>_RUNS).",
    )
    parser.add_argument(
        "--url", default="nats://127.0.0.1:4222", help="the NATS server (or a cluster's seeds)"
    )
    parser.add_argument("--creds", help="the analytics role's credential file (creds/analytics.creds)")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the deployment's namespace")
    parser.add_argument(
        "--durable", default=DEFAULT_DURABLE, help="this consumer's durable name on <NS>_RUNS"
    )
    parser.add_argument("--state", help="the figures' state file (default: analytics-<ns>-<durable>.json)")
    parser.add_argument("--json", action="store_true", help="JSON lines: one per hour, then the total")
    parser.add_argument(
        "--follow", action="store_true", help="keep consuming, print the figures as they move"
    )
    args = parser.parse_args(argv)
    try:
        sys.exit(asyncio.run(run(args)))
    except AnalyticsError as exc:
        sys.exit(f"analytics: {exc}")


if __name__ == "__main__":
    main()
