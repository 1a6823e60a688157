"""The executor's side of the journal as the bus (issue 33): an intent taken straight from its run's journal,
capability and all, by its partition's owner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.errors import PoisonMessage
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.journal_chain import BadLink, ChainHead, in_namespace, link_of
from crashsafe.contracts.run_events import (
    ActionRequested,
    decode_event,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest

# Where an outcome goes: back on OUTCOMES (a request from ACTIONS), or into the run's journal (one from the bus).
Reply = Callable[[ActionOutcome, Context], Awaitable[None]]


def intent_request(msg: Msg, ns: Namespace) -> ActionRequest:
    """The request an intent journaled for this executor makes, capability and all; a journal message that is no
    intent of its own run is a poison message (the runtime alone may write there)."""
    intent = decode_event(msg.data)
    if not isinstance(intent, ActionRequested) or ns.journal_run(msg.subject) != intent.run_id:
        raise PoisonMessage(f"{msg.subject} holds no intent of its run", run_id=ns.journal_run(msg.subject))
    return msgspec.structs.replace(request_for(intent), capability=intent.capability)


def intent_head(msg: Msg, ns: Namespace) -> ChainHead | None:
    """The run's chain head at the intent, from the link its runtime wrote: what the receipt appended right after
    it links to. None for an intent written without a link (a release before the chain), or with a bad one: its
    receipt is appended unlinked, and the chain still covers it (contracts/journal_chain.py)."""
    try:
        link = link_of(msg.headers)
    except BadLink:
        return None
    if link is None:
        return None
    return ChainHead(link.position - 1, link.prev).after(in_namespace(ns.name, msg.subject), msg.data)
