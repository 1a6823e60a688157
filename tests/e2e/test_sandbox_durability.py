"""The sandbox as a real provider is: a SIGKILLed, restarted process remembers every effect and every key."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from crashsafe.stack import free_port
from tests.support.waiting import eventually, unique
from tests.support.world import Sandbox

DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}


@asynccontextmanager
async def sandbox_process(data_dir: Path, port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """`crashsafe serve sandbox`, as a stack starts it (CRASHSAFE_DATA_DIR; its books in `<data dir>/sandbox`)."""
    env = {**os.environ, "CRASHSAFE_DATA_DIR": str(data_dir), "CRASHSAFE_SANDBOX_PORT": str(port)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crashsafe.cli", "serve", "sandbox", env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        async with httpx.AsyncClient(timeout=2) as http:

            async def up() -> bool:
                try:
                    return (await http.get(f"http://127.0.0.1:{port}/_faults")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(up, what="the sandbox to listen", timeout_s=30)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_sigkilled_sandbox_remembers_every_effect_and_key(tmp_path: Path) -> None:
    port, guest = free_port(), unique("guest")
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        async with sandbox_process(tmp_path, port) as first:
            booking_key, payment_key = unique("bk"), unique("pay")
            booking = await _write(
                http, "/bookings", booking_key, {"hotel_id": "lis-1", "guest_id": guest, **DATES}
            )
            pay = {
                "booking_id": booking["booking_id"],
                "guest_id": guest,
                "amount_cents": 24000,
                "currency": "EUR",
            }
            payment = await _write(http, "/payments", payment_key, pay)
            before = await Sandbox(http, url).ledger(guest)
            first.send_signal(signal.SIGKILL)
            await first.wait()

        assert (tmp_path / "sandbox" / "sandbox.sqlite3").exists()
        async with sandbox_process(tmp_path, port):
            after = await Sandbox(http, url).ledger(guest)
            assert after["entries"] == before["entries"]
            assert after["counts"]["booking"] == after["counts"]["charge"] == 1
            found = await http.get(f"/payments/by-key/{payment_key}")
            assert found.status_code == 200 and found.json() == payment
            # The same key after the restart is a replay, not a second charge.
            again = await http.post("/payments", json=pay, headers={"Idempotency-Key": payment_key})
            assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
            assert again.json() == payment
            assert (await Sandbox(http, url).counts(guest))["charge"] == 1
            # And the booking it paid for is still the held room it was.
            held = await http.get(f"/bookings/by-key/{booking_key}")
            assert held.json()["status"] == "held"


async def _write(http: httpx.AsyncClient, path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(path, json=body, headers={"Idempotency-Key": key})
    assert response.status_code == 201, response.text
    return dict(response.json())
