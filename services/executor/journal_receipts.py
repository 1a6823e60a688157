"""How a receipt leaves the executor when its intent came from the journal (issue 33): appended into the run's
journal on its family's subject right after its intent, so the run folds it with no second write; or, when
something followed the intent, sent as an outcome message for the runtime to check and journal once."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from opentelemetry.context import Context

from crashsafe.contracts.errors import RunVersionConflict
from crashsafe.contracts.headers import Header
from crashsafe.contracts.journal_bus import receipt_of
from crashsafe.contracts.journal_chain import CHAIN_HEADER, ChainHead
from crashsafe.contracts.run_events import event_encoder
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionOutcome
from crashsafe.services.executor.journal_intents import Reply
from crashsafe.services.executor.outcomes import OutcomePublisher
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.tracing import annotate, headers_for


class JournalReceipts:
    def __init__(
        self, broker: Broker, ns: Namespace, family: str, outcomes: OutcomePublisher, logger: logging.Logger
    ) -> None:
        self.broker = broker
        self.ns = ns
        self.family = family
        self.outcomes = outcomes
        self.logger = logger

    def reply_to(self, intent_seq: int, intent_head: ChainHead | None = None) -> Reply:
        """Where the outcome of the intent journaled at `intent_seq` goes: into its run's journal, linked after
        `intent_head` (the run's chain head at the intent; None: unlinked)."""

        async def reply(outcome: ActionOutcome, ctx: Context) -> None:
            await self.append(outcome, ctx, intent_seq, intent_head)

        return reply

    async def append(
        self, outcome: ActionOutcome, ctx: Context, intent_seq: int, intent_head: ChainHead | None = None
    ) -> None:
        """Append the receipt only if its intent is still the run's last event (`Crashsafe-Follows` says so): a
        run's journal then holds at most one receipt an executor wrote per intent, right after it, and a runtime
        holding the run at the intent folds it with no read. When anything followed (another step's intent, a
        wake, a hand-off, this receipt itself on a redelivery), the outcome goes on OUTCOMES instead, where the
        runtime checks it and journals it only if the run has not recorded it (`intake.completed`)."""
        annotate(ctx, outcome=outcome.status, via=outcome.via)
        receipt = receipt_of(outcome, datetime.now(UTC), tool=outcome.tool, family=self.family)
        # Right after its intent or not at all: the intent's head is the one this receipt links to.
        chained = {CHAIN_HEADER: intent_head.link().header()} if intent_head is not None else {}
        try:
            published = await self.broker.publish(
                self.ns.run_receipt(outcome.run_id, self.family),
                event_encoder.encode(receipt),
                # No message id: the fence is the sequence (an id another family could reserve, stream-wide).
                expected_subject_seq=intent_seq,
                sequence_subject=self.ns.run_events(outcome.run_id),
                headers={**headers_for(ctx), Header.FOLLOWS: str(intent_seq), **chained},
            )
        except RunVersionConflict:
            await self.outcomes.publish(outcome, ctx)
            return
        log(
            self.logger,
            logging.DEBUG,
            "receipt journaled",
            run_id=outcome.run_id,
            step_no=outcome.step_no,
            key=outcome.key,
            status=outcome.status,
            seq=published.seq,
        )
