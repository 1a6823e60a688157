"""Tamper-evident journals on a real nats-server (issue 34): every event a run journals carries its link in the
run's hash chain (the executor's receipt too), the runtime signs the run's head in a checkpoint chained after the
last, the bundle gathered from the deployment verifies, and an event an operator deletes from the stream, or a
checkpoint forked by a second runtime, is named."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats.js.errors
import pytest

from crashsafe.contracts.checkpoints import FIRST_PREV, checkpoint_decoder, stored_hash
from crashsafe.contracts.journal_chain import ChainHead, link_of
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.fold import replay
from crashsafe.evidence_verify import verify
from crashsafe.natsd import NatsServer
from crashsafe.services.operations.run_evidence import gather, walk_checkpoints
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.run_checkpoints import RunCheckpoints
from crashsafe.services.runtime.service import Runtime
from tests.support import capabilities, inprocess
from tests.support.broker import submit_inbound
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT

PUBLIC = capabilities.ISSUER.kid, capabilities._SESSION_KEY.public_key()
TRUSTED = {PUBLIC[0]: PUBLIC[1].public_bytes_raw()}


@dataclass
class Deployment:
    runtime: Runtime
    journal: RunJournal


@pytest.fixture
async def deployment(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[Deployment]:
    async with inprocess.serving(nats_server.url, namespace, tmp_path / "data") as (runtime, _):
        yield Deployment(runtime, RunJournal(broker, namespace))


async def _booked(deployment: Deployment, broker: Broker, namespace: Namespace) -> str:
    run_id = await submit_inbound(broker, namespace, unique("ev"), agent="booking", text=BOOKING_TEXT)

    async def ended() -> bool:
        events, _ = await deployment.journal.read(run_id)
        state = replay(events)
        return state is not None and state.terminal

    await eventually(ended, what=f"run {run_id} to end")
    await deployment.runtime.checkpoints.flush()
    return run_id


async def test_a_run_journaled_here_is_chained_checkpointed_and_verifies(
    deployment: Deployment, broker: Broker, namespace: Namespace
) -> None:
    run_id = await _booked(deployment, broker, namespace)
    stored = await deployment.journal.stored(run_id)
    head = ChainHead(0, FIRST_PREV)
    for message in stored:
        # Every event links to the one before it, the receipts the executors appended included.
        assert link_of(message.headers) == head.link(), message.subject
        head = head.after(message.subject.removeprefix(f"{namespace.name}."), message.data)
    assert any(".receipt." in m.subject for m in stored)
    bundle = await gather(broker, namespace, inprocess.REGISTRY, "", run_id, [PUBLIC[1]])
    assert bundle is not None
    assert bundle.checkpoints and bundle.checkpoints[-1].head.head == head.hash
    verification = verify(bundle, TRUSTED, inprocess.REGISTRY)
    failed = [f for f in verification.findings if f.status != "pass"]
    assert verification.verdict == "verified", failed


async def test_an_event_deleted_from_the_stream_is_named(
    deployment: Deployment, broker: Broker, namespace: Namespace
) -> None:
    """An operator with the stream's admin rights deletes one event of an ended run: the next event's link and the
    signed head both say where."""
    run_id = await _booked(deployment, broker, namespace)
    stored = await deployment.journal.stored(run_id)
    victim = stored[3]
    await broker.js.delete_msg(namespace.stream(StreamKind.RUNS), victim.seq)
    bundle = await gather(broker, namespace, inprocess.REGISTRY, "", run_id, [PUBLIC[1]], ask_providers=False)
    assert bundle is not None and len(bundle.journal) == len(stored) - 1
    verification = verify(bundle, TRUSTED, inprocess.REGISTRY)
    assert verification.verdict == "tampered"
    chain = [f for f in verification.findings if f.check == "chain" and f.status == "fail"]
    assert chain and chain[0].position == 4, chain


async def test_checkpoints_are_sealed_and_two_runtimes_never_fork_them(
    deployment: Deployment, broker: Broker, namespace: Namespace
) -> None:
    """Two runtimes signing at once take turns on the stream (expected last sequence): each checkpoint names the
    one before it, whoever wrote it; and no checkpoint can be deleted through the API."""
    other = RunCheckpoints(broker, namespace, capabilities.ISSUER, deployment.runtime.logger)
    mine = deployment.runtime.checkpoints

    async def sign(checkpoints: RunCheckpoints, who: str) -> None:
        for i in range(20):
            checkpoints.note(f"run_{who}{i:023x}", ChainHead(i + 1, "ab" * 32))
            await checkpoints.flush()

    await asyncio.gather(sign(mine, "a"), sign(other, "b"))
    stream = namespace.stream(StreamKind.CHECKPOINTS)
    stored = await broker.read_subject(stream, namespace.checkpoints)
    prev, signed = FIRST_PREV, set()
    for message in stored:
        checkpoint = checkpoint_decoder.decode(message.data)
        assert checkpoint.prev == prev, message.seq
        prev = stored_hash(message.data)
        signed |= {h.run_id for h in checkpoint.heads}
    # Every head either noted is signed (the runtime's own timer may have signed some of its notes in one go).
    assert {f"run_{who}{i:023x}" for who in "ab" for i in range(20)} <= signed
    walk = await walk_checkpoints(broker, namespace, TRUSTED)
    assert walk.breaks == [] and {h.run_id for h in checkpoint.heads} <= set(walk.proofs)
    with pytest.raises(nats.js.errors.Error):
        await broker.js.delete_msg(stream, stored[0].seq)
    # A checkpoint signed with a key this deployment never had, put after the last: `verify --live` names it.
    forger = RunCheckpoints(broker, namespace, capabilities.OTHER_ISSUER, deployment.runtime.logger)
    forger.note("run_" + "f" * 24, ChainHead(1, "cd" * 32))
    await forger.flush()
    breaks = (await walk_checkpoints(broker, namespace, TRUSTED)).breaks
    assert len(breaks) == 1 and "signature does not hold" in breaks[0], breaks


async def test_one_checkpoint_a_turn_however_busy_and_signing_goes_on_past_a_bad_one(
    deployment: Deployment, broker: Broker, namespace: Namespace
) -> None:
    """Heads noted while a turn publishes wait for the next turn (a turn once kept signing as long as notes came:
    hundreds of checkpoints a second, kept forever); a checkpoint on the stream that does not decode (kept for
    good: the stream refuses deletes) is chained after by its stored bytes, never a reason to stop signing."""
    checkpoints = deployment.runtime.checkpoints
    checkpoints.stop()  # this test's turns only
    stream = namespace.stream(StreamKind.CHECKPOINTS)
    before = await broker.stream_head(stream)
    busy = True

    async def note() -> None:
        i = 0
        while busy:
            checkpoints.note(f"run_{i:024x}", ChainHead(1, "ab" * 32))
            i += 1
            await asyncio.sleep(0)

    noting = asyncio.create_task(note())
    await asyncio.sleep(0.01)
    await checkpoints.flush()
    busy = False
    await noting
    assert await broker.stream_head(stream) == before + 1
    assert checkpoints.pending  # what came meanwhile waits for the next turn

    garbage = await broker.publish(namespace.checkpoints, b"\x00 not a checkpoint")
    checkpoints._last = None  # as a runtime that starts now
    await checkpoints.flush()
    walk = await walk_checkpoints(broker, namespace, TRUSTED)
    # The bad one is named (it decodes as nothing, so it names no predecessor); the next chains after its bytes.
    assert walk.breaks and all(f"seq {garbage.seq} " in b for b in walk.breaks), walk.breaks
    assert await broker.stream_head(stream) == garbage.seq + 1
