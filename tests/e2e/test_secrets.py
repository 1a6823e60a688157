"""No API key, in clear or hashed, in a log line, a journal event, a stream message, stack.json, an error body or
any other file a stack writes (the one exception: `<state>/api_key`, whose job it is to hold the stack's key)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from contracts.clients import secret_hash, split_key
from contracts.streams import stream_specs
from services.platform.jetstream import Broker
from tests.support.stack import StackClient, auth_header
from tests.support.world import BOOKED_AND_PAID


async def test_a_full_booking_leaves_no_key_anywhere_but_its_own_file(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack(env={"CRASHSAFE_LOG_LEVEL": "DEBUG"})  # every log line a stack can write
    stack = client.stack
    parts = split_key(client.api_key)
    assert parts is not None
    key_id, secret = parts
    forged = secrets.token_urlsafe(32)  # a caller's wrong secret for a real key id: must not be logged either
    wanted = {
        "the admin key": client.api_key,
        "its secret": secret,
        "its hash": secret_hash(secret),
        "a forged secret": forged,
        "the forged secret's hash": secret_hash(forged),
    }

    refused = await client.gateway.post("/v1/events", json={}, headers=auth_header(f"csk_{key_id}_{forged}"))
    assert refused.status_code == 401
    run_id, guest = await client.start_run()
    summary = await client.wait_terminal(run_id)
    assert summary["status"] == "completed", summary
    assert await client.counts(guest) == BOOKED_AND_PAID
    bodies = [refused.text, (await client.gateway.get(f"/v1/runs/{run_id}/events")).text]
    bodies.append((await client.reconcile(run_id)).text)
    await asyncio.to_thread(stack.stop)  # every log flushed and closed

    # Every message of every stream of the namespace: journals, inbound events, outcomes, dead letters.
    messages: list[bytes] = []
    for spec in stream_specs(client.ns):
        for subject in spec.subjects:
            for message in await broker.read_subject(spec.name, subject):
                messages.append(message.data + repr(sorted(message.headers.items())).encode())
    assert any(b"run.completed" in m for m in messages), "the journal was read"

    files = [p for p in stack.state_dir.rglob("*") if p.is_file() and p.name != "api_key"]
    assert any(p.name == "stack.json" for p in files) and any(p.suffix == ".log" for p in files)
    assert any(run_id.encode() in p.read_bytes() for p in files if p.suffix == ".log"), (
        "the logs were written"
    )
    assert (stack.state_dir / "api_key").read_text().strip() == client.api_key
    leaks = [
        f"{what} in {where}"
        for what, value in wanted.items()
        for where, data in [
            *((str(p.relative_to(stack.state_dir)), p.read_bytes()) for p in files),
            *((f"stream message {i}", m) for i, m in enumerate(messages)),
            *((f"response body {i}", b.encode()) for i, b in enumerate(bodies)),
        ]
        if value.encode() in data
    ]
    assert not leaks, leaks
