"""A partition's store follows the partition (issue 31, months of runs): executor a backs up the stores it holds, b
takes the partitions over on an empty data dir with the backup directory shared, restores the newest backup a
left, and answers every key a asked, before and after the backup, from its receipt, even once the keys' facts have
expired. Real executor replicas on the real nats-server, the sandbox as the provider; key facts kept seconds."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from crashsafe.contracts.backup_schedule import BackupSchedule
from crashsafe.contracts.errors import StoreBackupUnavailable
from crashsafe.contracts.heartbeats import (
    CONTRACTED_KEY,
    Contracted,
    VersionBeat,
    beat_encoder,
    contracted_encoder,
)
from crashsafe.contracts.keys import business_key, partition_of
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.streams import key_facts_spec, versions_spec
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, Answer, Asked, OutcomeStatus
from crashsafe.domain.backup_rules import BackupName
from crashsafe.domain.partition_ownership import Holder, Holding
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.fact_seals import FactSeals
from crashsafe.services.executor.partition_stores import PartitionStores
from crashsafe.services.executor.service import Executor
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.integration import test_partition_leases as leases
from tests.integration.test_partition_leases import PARTITIONS, Replicas
from tests.support import inprocess
from tests.support.waiting import eventually

replicas = leases.replicas

FACTS_S = 2  # a key's facts, once sealed, are kept this long (below the setting's floor: tests only)
# A row is sealed only if settled this long before its backup began (fact_seals.IN_BACKUP_MARGIN_S).
SETTLE_S = 1.1


def _settings(replicas: Replicas, worker: str) -> Settings:
    return dataclasses.replace(
        replicas.settings(worker),
        # Rounds by hand: the schedule's own loop would back up at times the test does not choose.
        store_backups=BackupSchedule(dir=replicas.root / "backups", every_s=3600.0),
        retention=dataclasses.replace(RecordRetention(), key_facts_s=FACTS_S),
    )


async def _executor(replicas: Replicas, worker: str) -> Executor:
    return await replicas.running.enter_async_context(
        inprocess.executor(_settings(replicas, worker), "payment")
    )


async def _contracted(broker: Broker, replicas: Replicas) -> None:
    """What `crashsafe infra contract` records once every process runs 0.3.0: facts may expire from now on."""
    marker = contracted_encoder.encode(Contracted(release=VERSION, at=datetime.now(UTC)))
    await broker.kv_write(versions_spec(replicas.ns), CONTRACTED_KEY, marker, revision=None)


async def _charge(replicas: Replicas, guest: str) -> ActionRequest:
    request = await replicas.payment(guest)
    identity = {"booking_id": request.args["booking_id"]}
    return msgspec.structs.replace(request, key=business_key("charge", "t1", identity))


async def _asked(worker: Executor, replicas: Replicas, request: ActionRequest) -> ActionOutcome:
    await inprocess.deliver(worker, request, 1)

    def answer() -> ActionOutcome | None:
        found = [o for o in replicas.outcomes if o.key == request.key and o.run_id == request.run_id]
        return found[-1] if found else None

    return await eventually(answer, what=f"the answer to {request.run_id}'s {request.key}")


def _again(request: ActionRequest, n: int) -> ActionRequest:
    """The same charge asked now by another run of the tenant (the same business key and input): after the
    takeover, so nothing says to look it up first; only the store's row or the key's facts know it."""
    now = datetime.now(UTC)
    return msgspec.structs.replace(
        request,
        run_id=f"{request.run_id}x{n}",
        step_no=90 + n,
        requested_at=now,
        deadline_at=now + timedelta(seconds=60),
    )


async def _crash(worker: Executor) -> None:
    """The process dies: no lease renewed, nothing pulled, no backup at a release (its leases expire by TTL)."""
    worker.keeper._closing = True
    assert worker.keeper._loop_task is not None
    worker.keeper._loop_task.cancel()
    await asyncio.gather(worker.keeper._loop_task, return_exceptions=True)
    await worker.backups.stop()
    for subscription in list(worker.feeds.requests.values()):
        await worker.broker.unsubscribe(subscription)


async def _newer_fenced_backup(replicas: Replicas, partition: int) -> BackupName:
    """An empty store's backup named as if a holder above any real one took it: never to be restored."""
    empty = await ActionStore.open(replicas.root / "planted" / "empty.sqlite3")
    name = BackupName(epoch=9 * 10**15, token=1, store=empty.store_id)
    await empty.close()
    folder = replicas.root / "backups" / replicas.ns.name / "payment" / f"p{partition}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name.file).write_bytes((replicas.root / "planted" / "empty.sqlite3").read_bytes())
    return name


async def _facts(book: FactBook, requests: list[ActionRequest]) -> list[bool]:
    """Whether each request's key has facts now."""
    return [(await book.read(r.key))[0] is not None for r in requests]


@pytest.mark.timeout(60)
async def test_a_partition_taken_over_on_an_empty_volume_answers_every_key_from_its_restored_store(
    replicas: Replicas, broker: Broker
) -> None:
    """k1 is backed up in three backups, k2 in two, k3 in one, k4 in none (a died after it). b, with none of a's
    files, restores the newest backup a left (not a planted one from above it in the fencing order), and every
    key asked again by another run is answered from its receipt, with no second call: k1 and k2, whose facts
    expired once two backups held them, from the restored store; k3 and k4 from their facts, which no TTL touches
    until b's own backups hold them. Before: b met an empty store; with facts that expire, k1 and k2 were charged
    again."""
    a = await _executor(replicas, "pay-a")
    await _contracted(broker, replicas)
    asked: list[ActionRequest] = []
    for n in range(1, 5):
        request = await _charge(replicas, f"guest-{n}")
        made = await _asked(a, replicas, request)
        assert made.status == OutcomeStatus.SUCCEEDED, made
        asked.append(request)
        if n < 4:
            await asyncio.sleep(SETTLE_S)
            assert await a.backups.round() == PARTITIONS
    assert a.backups.seals.sealed == 2  # k1 (in backups 1 and 2), k2 (in 2 and 3)
    book = FactBook(broker, replicas.ns, "payment")

    async def sealed_ones_gone() -> bool:
        return await _facts(book, asked[:2]) == [False, False]

    await eventually(sealed_ones_gone, what="k1's and k2's facts to expire")
    assert await _facts(book, asked[2:]) == [True, True], "k3's or k4's facts expired"

    partitions = {partition_of(r.key, PARTITIONS) for r in asked}
    assert a.backups.shelf is not None
    newest = {p: max(await a.backups.shelf.names(p), key=lambda n: n.holding) for p in partitions}
    planted = [await _newer_fenced_backup(replicas, p) for p in sorted(partitions)]
    await _crash(a)

    b = await _executor(replicas, "pay-b")  # an empty data dir of its own; the backup directory shared
    await eventually(lambda: b.partitions == list(range(PARTITIONS)), what="b to take every partition")
    await asyncio.sleep(b.settings.clock_skew_s)  # past the takeover, as a run asking weeks later is

    before = await replicas.world.ledger()
    for n, request in enumerate(asked):
        answer = await _asked(b, replicas, _again(request, n))
        assert answer.status == OutcomeStatus.SUCCEEDED, answer
        # Its receipt replayed (the evidence before it is the first asker's own call, carried with the receipt).
        assert (answer.evidence[-1].asked, answer.evidence[-1].answer) == (
            Asked.STORE_RECEIPT,
            Answer.REPLAYED,
        )
    after = await replicas.world.ledger()
    assert after["counts"]["charge"] == before["counts"]["charge"] == 4
    assert after["replays"].get("charge", 0) == 0
    assert not set(b.backups.restored.values()) & set(planted), (
        "a backup from above b's fencing place restored"
    )
    assert {p: b.backups.restored.get(p) for p in partitions} == newest

    # The partitions' epochs are never sealed: they order every holder to come.
    for p in partitions:
        assert await broker.kv_get(key_facts_spec(replicas.ns), replicas.ns.partition_epoch_key("payment", p))


@pytest.mark.timeout(40)
async def test_a_clean_release_backs_the_store_up_and_the_next_holder_restores_that_backup(
    replicas: Replicas, broker: Broker
) -> None:
    """a never ran a backup round; its clean stop backs each partition's store up before handing the lease back,
    and b, on an empty data dir, restores exactly that backup: the key a charged last is in b's store, answered
    from it. Before: nothing backed up at a release, b met an empty store."""
    a = await _executor(replicas, "pay-a")
    request = await _charge(replicas, "guest-last")
    assert (await _asked(a, replicas, request)).status == OutcomeStatus.SUCCEEDED
    partition = partition_of(request.key, PARTITIONS)
    await a.close()
    assert a.backups.shelf is not None
    released = await a.backups.shelf.names(partition)
    assert len(released) == 1

    b = await _executor(replicas, "pay-b")
    await eventually(lambda: b.partitions == list(range(PARTITIONS)), what="b to take every partition")
    assert b.backups.restored.get(partition) == released[0]
    record = await b.stores[partition].get(request.key)
    assert (
        record is not None and record.outcome is not None and record.outcome.status == OutcomeStatus.SUCCEEDED
    )


@pytest.mark.timeout(40)
async def test_no_key_fact_expires_while_a_process_of_0_2_0_is_alive(
    replicas: Replicas, broker: Broker
) -> None:
    """Contracted, but a 0.2.0 process still beats: it neither backs up nor restores, so a partition it takes over
    meets only its own file and the facts. Two backups hold the key settled, and its facts keep no TTL. Before
    the census was read, they were sealed and expired under it."""
    a = await _executor(replicas, "pay-a")
    await _contracted(broker, replicas)
    now = datetime.now(UTC)
    old = VersionBeat(
        version="0.2.0",
        runs_beside_since="0.1.0",
        service="executor-payment",
        worker="old-1",
        pid=1,
        started_at=now,
        beat_at=now,
    )
    spec = versions_spec(replicas.ns)
    key = replicas.ns.version_beat_key("executor-payment", "old-1")
    await broker.kv_write(spec, key, beat_encoder.encode(old), revision=None, ttl_s=60)
    request = await _charge(replicas, "guest-beside")
    assert (await _asked(a, replicas, request)).status == OutcomeStatus.SUCCEEDED
    await asyncio.sleep(SETTLE_S)
    for _ in range(3):
        await a.backups.round()
    assert a.backups.seals.sealed == 0
    await asyncio.sleep(FACTS_S + 0.5)
    assert await _facts(FactBook(broker, replicas.ns, "payment"), [request]) == [True]


async def test_a_row_not_yet_settled_in_a_backup_is_sealed_once_a_later_one_holds_it_settled(
    replicas: Replicas,
) -> None:
    """The seal reads each round's new rows once; a row still open then (an unknown outcome, a call in flight) is
    remembered and looked at again, so its facts get their TTL once it settles, instead of never (a leak) or
    before any backup holds its receipt (a loss)."""
    store = await ActionStore.open(replicas.root / "seal" / "p0.sqlite3")
    try:
        first, second = replicas.book("guest-a"), replicas.book("guest-b")
        for request in (first, second):
            assert await store.begin(request, 1)
        await store.finish(ActionOutcome(**_receipt(first)), 1)
        last = await store.last_rowid()
        now = datetime.now(UTC).timestamp()
        found, waiting = await store.settled_between(0, last, now + 1, now - 60, [])
        assert (found, waiting) == ([(first.key, 1)], [2])
        await store.finish(ActionOutcome(**_receipt(second)), 1)
        found, waiting = await store.settled_between(last, last, now + 1, now - 60, waiting)
        assert (found, waiting) == ([(second.key, 1)], [])
    finally:
        await store.close()


def _receipt(request: ActionRequest) -> dict[str, object]:
    return {
        "run_id": request.run_id,
        "step_no": request.step_no,
        "tool": request.tool,
        "key": request.key,
        "status": OutcomeStatus.SUCCEEDED,
    }


async def test_a_damaged_newest_backup_is_passed_over_for_the_one_before_and_two_stop_the_takeover(
    replicas: Replicas, broker: Broker
) -> None:
    """One backup behind is safe (a fact is sealed only once two backups hold its key); two behind is not, so the
    partition is refused (StoreBackupUnavailable, handed back) rather than served from a store missing keys whose
    facts expired."""
    source = await ActionStore.open(replicas.root / "source" / "p0.sqlite3")
    schedule = BackupSchedule(dir=replicas.root / "backups")
    stores = PartitionStores(
        schedule,
        replicas.ns.name,
        "payment",
        {},
        lambda p: Holding(10**13, 1),
        FactSeals(FactBook(broker, replicas.ns, "payment"), 0, logging.getLogger("tests")),
        logging.getLogger("tests"),
    )
    assert stores.shelf is not None
    # A backup whose writer died before its rename (a pod killed at a release), an hour ago: cleared by the next.
    unfinished = stores.shelf.folder(0) / ".0-0-dead.sqlite3.x.tmp"
    unfinished.parent.mkdir(parents=True)
    unfinished.write_bytes(b"half")
    os.utime(unfinished, (time.time() - 7200, time.time() - 7200))
    names = []
    for token in (1, 2, 3):
        assert await source.begin(replicas.book(f"guest-{token}"), token)
        names.append(await stores.shelf.put(source.path, 0, Holding(100, token), source.store_id))
    await source.close()
    assert not unfinished.exists()

    async def previous(partition: int) -> Holder:
        return Holder(store=source.store_id, owner="pay-a", token=3, epoch=100)

    folder = stores.shelf.folder(0)
    (folder / names[2].file).write_bytes(b"not a database")
    restored = await stores.open(0, replicas.root / "b" / "p0.sqlite3", "NORMAL", previous)
    assert stores.restored[0] == names[1] and await restored.count() == 2
    assert restored.store_id != source.store_id  # a store of its own: the acquisition is a takeover
    await restored.close()

    (folder / names[1].file).write_bytes(b"not a database either")
    with pytest.raises(StoreBackupUnavailable):
        await stores.open(0, replicas.root / "c" / "p0.sqlite3", "NORMAL", previous)
