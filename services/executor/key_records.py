"""What a key's records say across this replica's stores and the facts beside them: the plan a keyed request gets,
a key adopted from another store, the compensation that undid it, each attempt and the receipt."""

from __future__ import annotations

import time
from collections.abc import Callable

from crashsafe.contracts.keys import CompensationKind, compensation_key, partition_of
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest
from crashsafe.domain import key_facts
from crashsafe.domain.conflict_answer import existing_of, told
from crashsafe.domain.execution import Conflict, Execute, Plan, Record, Resolve, classify
from crashsafe.domain.partition_ownership import Holding
from crashsafe.domain.registry import Tool
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.crashpoints import crash_point


class KeyRecords:
    def __init__(
        self,
        facts: FactBook,
        stores: dict[int, ActionStore],
        partitions: int,
        holding: Callable[[int], Holding],
    ) -> None:
        self.facts = facts
        # The executor's own map of held partitions to their stores (the same dict: it changes as leases move).
        self.stores = stores
        self.partitions = partitions
        # Where this replica stands in a partition's fencing order ((0, 0) if not held: every fenced write refuses).
        self.holding = holding

    async def undone(self, own: ActionStore, request: ActionRequest, tool: Tool) -> Record | None:
        """The record of a compensation of this key, if a store this executor holds has one. A business key's
        compensation is partitioned with the key it undoes (`keys.partition_key`), so the key's own store has it;
        a step key's may be in a partition another replica owns (its run never asks for it again anyway). A
        store that took its partition over may have missed a compensation the previous store ran: the key's
        facts say."""
        if tool.contract.compensation is None:
            return None
        for kind in CompensationKind:
            key = compensation_key(request.key, kind)
            store = self.stores.get(partition_of(key, self.partitions))
            record = await store.get(key) if store is not None else None
            if record is not None:
                return record
        if own.takeover_at is not None and key_facts.shared(request.key):
            facts, _ = await self.facts.read(request.key)
            undone = key_facts.undone_record(facts) if facts is not None else None
            if undone is not None:
                return undone
            # Not marked undone (yet): a compensation begun on another store has facts of its own.
            for kind in CompensationKind:
                begun, _ = await self.facts.read(compensation_key(request.key, kind))
                if begun is not None:
                    return key_facts.as_record(begun)
        return None

    async def learn(self, store: ActionStore, request: ActionRequest) -> tuple[Record | None, Record | None]:
        """A key this store has just begun: its facts beside the store, if another store or run asked for it
        first (adopted into this store, which answers it from now on), and the compensation that undid it.
        A shared key's first ask is recorded there now (one compare-and-set); a step key's facts are only
        read, and only when it was asked before this store took its partition over."""
        partition = partition_of(request.key, self.partitions)
        if key_facts.shared(request.key):
            mine = key_facts.first_asked(request, time.time(), self.holding(partition), store.store_id)
            known = await self.facts.first(mine, store.fence)
        elif store.inherits(request):
            known, _ = await self.facts.read(request.key)
        else:
            return None, None
        if known is None:
            return None, None
        record = key_facts.as_record(known)
        await store.adopt(record)
        return record, key_facts.undone_record(known)

    async def attempted(
        self, store: ActionStore, request: ActionRequest, attempts: int, sent_at: float
    ) -> None:
        """A new attempt made durable before its call, beside the store and in it: a next life or a next store
        counts on from here and waits out this call's window before calling again."""
        partition = partition_of(request.key, self.partitions)
        holding = self.holding(partition)

        def change(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts:
            base = current or key_facts.first_asked(request, sent_at, holding, store.store_id)
            return key_facts.attempted(base, attempts, sent_at, holding, store.store_id)

        await self.facts.change(request.key, change, holding, store.fence, partition)
        await store.attempt(request.key, attempts, sent_at)

    async def settle(
        self, store: ActionStore, request: ActionRequest, receipt: ActionOutcome, stream_seq: int | None
    ) -> None:
        """Commit the receipt: beside the store first (a shared key, or one whose attempts left facts there),
        then in it; and a compensation's success on the key it undid, so no store replays the undone effect."""
        partition = partition_of(request.key, self.partitions)
        holding = self.holding(partition)
        if key_facts.shared(receipt.key) or receipt.attempts > 1:

            def change(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts:
                base = current or key_facts.first_asked(request, time.time(), holding, store.store_id)
                return key_facts.settled(base, receipt, holding, store.store_id)

            await self.facts.change(receipt.key, change, holding, store.fence, partition)
        base_key = key_facts.undoes(receipt)
        if base_key is not None:

            def mark(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts | None:
                if current is None:
                    return None  # never asked through the facts (a key from before them): its store knows
                return key_facts.undone(current, receipt.key, holding, store.store_id)

            await self.facts.change(base_key, mark, holding, store.fence, partition)
        await store.finish(receipt, stream_seq)

    async def plan(
        self, store: ActionStore, request: ActionRequest, tool: Tool, stream_seq: int, deliveries: int
    ) -> tuple[Plan, Record | None, Record | None]:
        """What a keyed request gets (execute, replay, resolve, conflict…), from its record in the store or beside
        it, and the compensation that undid it; a key never seen has its intent committed first."""

        # The common case is a key never seen: try to commit its intent first, and read the record only if it exists.
        record: Record | None
        if await store.begin(request, stream_seq):
            crash_point("executor.after_intent")
            # A key this store never saw may be known beside it (asked by another run, on another store).
            record, undone = await self.learn(store, request)
            if record is not None:
                if undone is None and record.status.settled:
                    undone = await self.undone(store, request, tool)
                plan: Plan = classify(record, request, deliveries, undone)
            elif store.inherits(request):
                # Asked before this store took the partition over, and no facts: the previous holder may have
                # sent one call (a second would have left facts), no later than the takeover.
                plan = Resolve(attempts=1, sent_at=store.takeover_at)
            else:
                plan = Execute()
        else:
            record = await store.get(request.key)
            undone = (
                await self.undone(store, request, tool)
                if record is not None and record.status.settled
                else None
            )
            plan = classify(record, request, deliveries, undone)
        if isinstance(plan, Conflict) and record is not None:
            plan = Conflict(await self.conflict(plan.outcome, request, record, undone))
        return plan, record, undone

    async def conflict(
        self, outcome: ActionOutcome, request: ActionRequest, record: Record, undone: Record | None
    ) -> ActionOutcome:
        """A conflict told with the effect its key already made, if the asker owns it: a shared key's owner is
        in its facts (read only when there is an effect to show; a conflict is rare)."""
        owner = None
        if existing_of(record, undone) is not None and key_facts.shared(request.key):
            facts, _ = await self.facts.read(request.key)
            owner = facts.owner if facts is not None else None
        return told(outcome, request, record, undone, owner)
