"""How an outcome leaves the executor: on its run's outcomes subject, traced, and with no message id (why below)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import msgspec
from opentelemetry.context import Context

from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionOutcome, Evidence, tool_encoder
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.tracing import annotate, headers_for


class OutcomePublisher:
    def __init__(self, broker: Broker, ns: Namespace, family: str, logger: logging.Logger) -> None:
        self.broker = broker
        self.ns = ns
        self.family = family
        self.logger = logger

    async def publish(self, outcome: ActionOutcome, ctx: Context) -> None:
        annotate(ctx, outcome=outcome.status, via=outcome.via)
        await self.broker.publish(
            self.ns.outcomes(self.family, outcome.run_id),
            tool_encoder.encode(outcome),
            # No message id: JetStream deduplicates per stream, not per subject, so a predictable id would let any
            # publisher to the outcomes stream (another family, a wake) reserve this one and have it dropped as a
            # duplicate. The runtime records a repeated outcome once (record_outcome), which is all the id bought.
            headers=headers_for(ctx),
        )
        log(
            self.logger,
            logging.DEBUG,
            "outcome",
            run_id=outcome.run_id,
            step_no=outcome.step_no,
            key=outcome.key,
            status=outcome.status,
            via=outcome.via,
        )


def with_note(outcome: ActionOutcome, asked: str, answer: str) -> ActionOutcome:
    """The outcome with a line of evidence saying the store answered it (a replay, a conflict, a republish)."""
    note = Evidence(
        asked=asked,
        key=outcome.key,
        answer=answer,
        detail="answered from the action store",
        at=datetime.now(UTC),
    )
    return msgspec.structs.replace(outcome, evidence=[*outcome.evidence, note])
