"""A booking run journaled up to a held action, as the runtime would have written it: for tests of what comes after
a hold (the wait, the decision, the expiry) through a real stack, independent of which rule held it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from crashsafe.contracts.clients import split_key
from crashsafe.contracts.keys import run_id_for, tool_input_hash
from crashsafe.contracts.run_events import ApprovalRequested, Budget, RunStarted
from crashsafe.domain.call_plan import approval_id_for
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import model_answered
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.inprocess import REGISTRY
from tests.support.stack import StackClient
from tests.support.waiting import unique
from tests.support.world import BOOKING_TEXT


def key_id_of(key: str) -> str:
    parts = split_key(key)
    assert parts is not None, "the stack's key is csk_<key_id>_<secret>"
    return parts[0]


async def held_search(
    client: StackClient,
    broker: Broker,
    *,
    approver: str,
    ttl_s: float,
    question: str,
    session: str | None = None,
    guest: str | None = None,
    claim: Callable[[str], Awaitable[str]] | None = None,
) -> tuple[str, str]:
    """A booking run of the stack's tenant, started by its admin key, whose first call (the hotel search) waits for
    `approver`, woken so the runtime takes it up: (run id, approval id). A manager decides it with the stack's
    approver key (`StackClient.manager`). `run_id_for(tenant, event id)` as the gateway would name it;
    `claim` (the session's lane, as the gateway claims it) must give the session to this run before it starts."""
    settings = inprocess.settings_for(client.stack.nats_url, client.ns, sandbox_url=client.stack.sandbox_url)
    journal = RunJournal(broker, client.ns)
    key = unique("ev")
    run_id = run_id_for(client.tenant, key)
    if claim is not None:
        assert await claim(run_id) == run_id
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=session or f"s-{key}",
        guest_id=guest or unique("g"),
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
        tenant=client.tenant,
        started_by=key_id_of(client.api_key),  # the stack's admin key, as its gateway records it
    )
    seq = await journal.append(started, 0)
    async with inprocess.scripted_model(settings) as model:
        reply = await model.answer(REGISTRY.agent("booking"), fold_run(None, started).transcript)
    (search,) = reply.tool_calls
    seq = await journal.append(model_answered(fold_run(None, started), reply, now), seq)
    args = json.loads(search.arguments)
    approval_id = approval_id_for(run_id, 2)
    await journal.append(
        ApprovalRequested(
            run_id=run_id,
            at=now,
            step_no=2,
            approval_id=approval_id,
            call=search,
            tool=search.name,
            args=args,
            input_hash=tool_input_hash(search.name, args),
            approver=approver,
            rule="rule.test_hold",
            reason="held by the test's rule",
            expires_at=now + timedelta(seconds=ttl_s),
            question=question,
        ),
        seq,
    )
    await wake_run(broker, settings, run_id, "the test held an action", "test")
    return run_id, approval_id
