"""The runtime's tool-request publishing: each journaled request, signed, to the executor owning its key."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
from opentelemetry.context import Context

from crashsafe.contracts.capabilities import CapabilityIssuer
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.run_events import ActionRequested
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.tool_messages import tool_encoder
from crashsafe.domain.authority import Terms, resend_terms, terms_for, to_resolve
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import headers_for, span
from crashsafe.services.runtime.held_runs import HeldRun, sent


def utcnow() -> datetime:
    return datetime.now(UTC)


class ActionRequests:
    """Only the runtime publishes action requests, and only what its runs journaled."""

    def __init__(
        self, broker: Broker, settings: Settings, issuer: CapabilityIssuer, bus: bool = False
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        # Signs every action request this runtime publishes; the only holder of the signing key.
        self.issuer = issuer
        # The journal as the bus (issue 33): since 0.4.0 each intent is journaled on its executor's subject, signed,
        # and sent on ACTIONS only when it must be sent again (a wake). Off: journaled as a step and sent on ACTIONS.
        self.bus = bus

    def on_the_bus(self, intent: ActionRequested, agent: str) -> tuple[ActionRequested, str] | None:
        """The intent as the journal carries it to its executor (the journal as the bus): signed as a published
        request is, on the subject of its family and the partition owning its key. None while the bus is off:
        it is journaled as a step and published on ACTIONS (`publish_pending`)."""
        if not self.bus:
            return None
        terms = terms_for(intent, utcnow())
        granted = self.issuer.grant(request_for(intent), terms.origin, terms.expires_at, agent)
        partition = partition_of(intent.key, self.settings.partitions)
        subject = self.ns.run_intent(intent.run_id, intent.family, partition)
        return msgspec.structs.replace(intent, capability=granted.capability), subject

    async def publish_pending(self, run: HeldRun, ctx: Context) -> None:
        """Each request the run waits on that this worker has not published yet. One journaled for the bus (it
        carries its capability) is in its executor's hands already: its partition's owner pulls it."""
        for request in run.state.pending:
            if request.capability is None and sent(request) not in run.published:
                await self.publish(request, ctx, agent=run.state.agent)
                run.published.add(sent(request))

    async def resolve(self, run: HeldRun, keys: list[str], ctx: Context) -> None:
        """The keys a wake names, re-sent from the journal with a fresh capability and a fresh message id (so they
        pass the duplicate window) to the owning executor, which answers from its receipt or asks the provider
        by key."""
        for intent in to_resolve(run.state, keys):
            await self.publish(
                intent,
                ctx,
                resend_terms(intent, utcnow()),
                f"resolve:{uuid.uuid4().hex}",
                agent=run.state.agent,
            )
            run.published.add(sent(intent))

    async def publish(
        self,
        intent: ActionRequested,
        ctx: Context,
        terms: Terms | None = None,
        msg_id: str = "request",
        *,
        agent: str,
    ) -> None:
        """Sign the journaled request and send it to the executor owning its key. Nats-Msg-Id
        (`<msg_id>:<run>:<step>:<key>`) dedups a re-publish inside the window; the executor's store dedups it forever."""
        subject = self.ns.actions_for_key(intent.family, intent.key, self.settings.partitions)
        terms = terms or terms_for(intent, utcnow())
        # Bound to the run's agent: an executor serves a compensation-only tool to a plan only for the agent
        # whose model may ask for it (support's refund_payment), never to another agent's run.
        request = self.issuer.grant(request_for(intent), terms.origin, terms.expires_at, agent)
        with request_span(intent, ctx) as published:
            await self.broker.publish(
                subject,
                tool_encoder.encode(request),
                # The run and step too: a business key may be asked by two steps or two runs, each its own request.
                msg_id=f"{msg_id}:{intent.run_id}:{intent.step_no}:{intent.key}",
                headers=headers_for(published),
            )


def request_span(intent: ActionRequested, ctx: Context) -> span:
    """The span of one request to an executor, whichever way it goes (on ACTIONS, or journaled on the bus): the
    executor's call is its child."""
    return span(
        SpanName.ACTION_REQUEST,
        ctx,
        run_id=intent.run_id,
        step_no=intent.step_no,
        idempotency_key=intent.key,
        tool=intent.tool,
    )
