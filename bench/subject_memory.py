"""`python bench/subject_memory.py [N]`: what a stream that keeps one subject per run costs nats-server in memory.

RUNS keeps two subjects per run forever (`<ns>.run.<id>.step` and `.milestone`), INBOUND one per run for 7 days,
and every KV bucket one per key. nats-server's file store keeps a per-subject index in memory (and rebuilds it
when it starts), so the memory a stream needs grows with its subjects, not only with its bytes. This stores N
messages of a journal event's size on N distinct subjects, then N on one subject, each in a fresh server, and
prints the server's resident memory and its restart time for each: the difference per message is what a kept
subject costs. Memory and restart time depend on the data, not on the machine's load (restart time a little).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats

from crashsafe.natsd import NatsServer, free_port

PAYLOAD = b"x" * 600  # about a journal event (docs/capacity.md: 700 bytes stored per RUNS message)
BATCH = 2_000


def _monitor(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        found: dict[str, object] = json.load(answer)
        return found


def _rss_mb(server: NatsServer) -> float:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _fill(url: str, count: int, distinct: bool) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=BATCH)
    await js.add_stream(name="S", subjects=["s.>"])
    for start in range(0, count, BATCH):
        # Acknowledged publishes, a batch in flight at a time: unacknowledged ones outrun the server's ingest
        # queue and are dropped. A run id's shape: 24 hex digits, as `keys.run_id_for` makes them.
        for i in range(start, min(start + BATCH, count)):
            await js.publish_async(f"s.run_{i:024x}.step" if distinct else "s.one", PAYLOAD)
        await js.publish_async_completed()
    deadline = time.monotonic() + 120
    while (await js.stream_info("S")).state.messages < count and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await nc.close()


def measure(count: int, distinct: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="crashsafe-subjects-") as tmp:
        port = free_port()
        server = NatsServer(Path(tmp), open_access=True, monitor_port=port).start()
        try:
            idle = _rss_mb(server)
            asyncio.run(_fill(server.url, count, distinct))
            time.sleep(2.0)
            filled = _rss_mb(server)
            server.stop()
            started = time.monotonic()
            server.start(timeout_s=300)
            restart_s = time.monotonic() - started
            time.sleep(2.0)
            restarted = _rss_mb(server)
            state = _monitor(port, "/jsz?streams=true")
        finally:
            server.stop()
    details = state.get("account_details") or []
    assert isinstance(details, list)
    stream = details[0]["stream_detail"][0]["state"]
    return {
        "messages": float(stream["messages"]),
        "subjects": float(stream.get("num_subjects", 0)),
        "stored_mb": stream["bytes"] / 2**20,
        "rss_idle_mb": idle,
        "rss_filled_mb": filled,
        "rss_restarted_mb": restarted,
        "restart_s": restart_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", nargs="?", type=int, default=1_000_000, help="messages (default 1,000,000)")
    args = parser.parse_args(argv)
    rows = {"one subject": measure(args.count, False), "a subject each": measure(args.count, True)}
    for name, r in rows.items():
        print(
            f"{name:<15} {r['messages']:>10.0f} msgs {r['subjects']:>10.0f} subjects {r['stored_mb']:>7.0f} MB stored; "
            f"RSS idle {r['rss_idle_mb']:.0f}, filled {r['rss_filled_mb']:.0f}, after restart "
            f"{r['rss_restarted_mb']:.0f} MB; restart {r['restart_s']:.2f} s"
        )
    one, each = rows["one subject"], rows["a subject each"]
    extra = (each["rss_restarted_mb"] - one["rss_restarted_mb"]) * 2**20 / args.count
    print(f"a kept subject costs about {extra:.0f} bytes of nats-server memory (after a restart)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
