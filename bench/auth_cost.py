"""What authenticating one request costs the gateway: the pure check, and the direct get of the key's record.

`python -m bench.auth_cost [--requests N]`: an embedded nats-server, one key, then (1) `authenticate` alone, (2) the
record read sequentially (latency), (3) the record read 64 at a time (throughput and the gateway's CPU per read)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from crashsafe.contracts.clients import Scope, split_key
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.access import authenticate, parse_bearer
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys


async def measure(url: str, requests: int) -> dict[str, float]:
    broker = await Broker.connect(url, "bench-auth")
    try:
        keys = ClientKeys(broker, Namespace("authbench"))
        await keys.ensure()
        key = (await keys.create("bench", [Scope.EVENTS_WRITE])).key
        parts = split_key(key)
        assert parts is not None
        key_id, secret = parts
        record = await keys.get(key_id)
        header = f"Bearer {key}"

        start = time.perf_counter()
        for _ in range(requests):
            authenticate(*parse_bearer(header), record)
        pure_us = (time.perf_counter() - start) / requests * 1e6

        latencies = []
        for _ in range(requests):
            t = time.perf_counter()
            await keys.get(key_id)
            latencies.append((time.perf_counter() - t) * 1e6)

        cpu, wall = time.process_time(), time.perf_counter()
        window = asyncio.Semaphore(64)

        async def one() -> None:
            async with window:
                await keys.get(key_id)

        await asyncio.gather(*(one() for _ in range(requests)))
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        latencies.sort()
        return {
            "check_us": pure_us,
            "get_p50_us": statistics.median(latencies),
            "get_p99_us": latencies[int(len(latencies) * 0.99)],
            "gets_per_s_64": requests / wall,
            "client_cpu_us_per_get": cpu / requests * 1e6,
        }
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crashsafe-auth-") as tmp:
        server = NatsServer(Path(tmp)).start()
        try:
            figures = asyncio.run(measure(server.url, args.requests))
        finally:
            server.stop()
    print(
        f"authenticate (parse + sha256 + constant-time compare): {figures['check_us']:.1f} µs\n"
        f"record read (direct get), sequential: p50 {figures['get_p50_us']:.0f} µs, p99 {figures['get_p99_us']:.0f} µs\n"
        f"record read, 64 in flight: {figures['gets_per_s_64']:.0f}/s, {figures['client_cpu_us_per_get']:.0f} µs of"
        " the caller's CPU each"
    )


if __name__ == "__main__":
    main()
