"""No API key (in clear or hashed), NATS seed, capability signing key or capability in a log line, a journal event,
a stream message, stack.json, an error body or any other file a stack writes. The exceptions are the files whose
job it is to hold one (`<state>/api_key`, `<state>/synthetic_key`, the 0600 credential and key files) and, for capabilities, the action
requests that carry them (the ACTIONS stream, and nats-server's own store of it)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from crashsafe.contracts.clients import secret_hash, split_key
from crashsafe.contracts.run_events import ActionRequested, decode_event
from crashsafe.contracts.streams import stream_specs
from crashsafe.contracts.subjects import StreamKind
from crashsafe.contracts.synthetic_turn import synthetic_decoder
from crashsafe.contracts.tool_messages import action_request_decoder
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import read_credential
from crashsafe.stack_keys import APPROVER_KEY_FILE, SYNTHETIC_KEY_FILE
from tests.support.stack import StackClient, auth_header
from tests.support.waiting import eventually
from tests.support.world import CONFIRMED, projected


async def test_a_full_booking_leaves_no_key_anywhere_but_its_own_file(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    # Every log line a stack can write, with the reconciler's synthetic turn using its own key meanwhile.
    client = await start_stack(
        env={"CRASHSAFE_LOG_LEVEL": "DEBUG", "CRASHSAFE_SYNTHETIC_EVERY_S": "1"}, synthetic=True
    )
    stack = client.stack
    parts = split_key(client.api_key)
    assert parts is not None
    key_id, secret = parts
    synthetic_key = (stack.state_dir / SYNTHETIC_KEY_FILE).read_text().strip()
    synthetic = split_key(synthetic_key)
    assert synthetic is not None
    approver = split_key(client.approver_key)
    assert approver is not None
    forged = secrets.token_urlsafe(32)  # a caller's wrong secret for a real key id: must not be logged either
    wanted = {
        "the admin key": client.api_key,
        "its secret": secret,
        "its hash": secret_hash(secret),
        "a forged secret": forged,
        "the forged secret's hash": secret_hash(forged),
        "the approver key": client.approver_key,
        "its secret as well": approver[1],
        "the synthetic key": synthetic_key,
        "its secret too": synthetic[1],
        "that secret's hash": secret_hash(synthetic[1]),
    }

    # A capability travels in the intent the journal carries to its executor (issue 33), or in a request sent
    # again on ACTIONS (which leaves that stream once acknowledged): watch both go by to learn them.
    signatures: list[str] = []

    async def carried(msg: Msg) -> None:
        if msg.subject.startswith(f"{client.ns.name}.action."):
            capability = action_request_decoder.decode(msg.data).capability
        else:
            intent = decode_event(msg.data)
            capability = intent.capability if isinstance(intent, ActionRequested) else None
        assert capability is not None and capability.sig
        signatures.append(capability.sig)

    watching = [
        await broker.nc.subscribe(subject, cb=carried)
        for subject in (client.ns.actions_all, client.ns.run_intents_all)
    ]
    refused = await client.gateway.post("/v1/events", json={}, headers=auth_header(f"csk_{key_id}_{forged}"))
    assert refused.status_code == 401
    run_id, guest = await client.start_run()
    summary = await client.wait_terminal(run_id)
    assert summary["status"] == "completed", summary
    assert await projected(lambda: client.counts(guest)) == CONFIRMED
    bodies = [refused.text, (await client.gateway.get(f"/v1/runs/{run_id}/events")).text]
    bodies.append((await client.reconcile(run_id)).text)
    for watch in watching:
        await watch.unsubscribe()

    async def probed() -> bool:
        ops = await broker.read_subject(
            client.ns.stream(StreamKind.OPS), client.ns.ops("synthetic", "reconciler")
        )
        return any(synthetic_decoder.decode(m.data).result == "ok" for m in ops)

    await eventually(probed, what="a synthetic turn of the reconciler, with its key")
    await asyncio.to_thread(stack.stop)  # every log flushed and closed

    # Every message of every stream of the namespace: journals, inbound events, outcomes, dead letters.
    messages: list[bytes] = []
    carriers: set[int] = set()  # the messages that carry a capability: the intents on the bus
    for spec in stream_specs(client.ns):
        for subject in spec.subjects:
            for message in await broker.read_subject(spec.name, subject):
                if spec.name == client.ns.stream(StreamKind.ACTIONS):
                    continue  # a capability's one home (and emptied as requests are acknowledged)
                if client.ns.journal_run(message.subject) and ".intent." in message.subject:
                    carriers.add(len(messages))
                messages.append(message.data + repr(sorted(message.headers.items())).encode())
    assert any(b"run.completed" in m for m in messages), "the journal was read"
    assert signatures, "the action requests were read"

    # Each NATS user's seed and the runtime's private key: only their own 0600 files may hold them.
    holders = {
        stack.state_dir / "api_key",
        stack.state_dir / APPROVER_KEY_FILE,
        stack.state_dir / SYNTHETIC_KEY_FILE,
        stack.capability_key,
    }
    assert stack.nats_creds_dir is not None
    for creds in stack.nats_creds_dir.glob("*"):
        if creds.is_file():
            holders.add(creds)
            wanted[f"the NATS seed of {creds.name}"] = read_credential(creds).seed
    pem = stack.capability_key.read_text().splitlines()
    wanted["the capability signing key"] = "".join(line for line in pem if not line.startswith("-----"))

    files = [p for p in stack.state_dir.rglob("*") if p.is_file() and p not in holders]
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

    # A capability only in the message that carries it: not logged, journaled elsewhere, written to stack.json or
    # answered.
    nats_store = stack.state_dir / "nats"
    ours = [p for p in files if nats_store not in p.parents]
    leaked = [
        where
        for sig in signatures
        for where, data in [
            *((str(p.relative_to(stack.state_dir)), p.read_bytes()) for p in ours),
            *((f"stream message {i}", m) for i, m in enumerate(messages) if i not in carriers),
            *((f"response body {i}", b.encode()) for i, b in enumerate(bodies)),
        ]
        if sig.encode() in data
    ]
    assert not leaked, leaked
