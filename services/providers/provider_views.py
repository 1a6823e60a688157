"""The provider's by-key view over NATS request/reply: executors answer, the gateway asks.

Read-only: a lookup through the tool's lookup path (services/providers/provider_calls.py), never a call. The gateway
holds no provider credential; each family's executors answer for their own family only (NATS permissions), one
replica per question (a queue group)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.provider_view import (
    NO_LOOKUP,
    ProviderViewReply,
    ProviderViewRequest,
    provider_view_encoder,
    provider_view_reply_decoder,
    provider_view_request_decoder,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.registry import ProviderAnswer, Tool
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.logs import log
from crashsafe.services.providers.provider_calls import Providers

# The gateway's own answer when no executor replied in time (or none runs): shown as such, never a 500.
NO_ANSWER = "no_answer"
LOOKUP_TIMEOUT_S = 5.0


def view_of(answer: ProviderAnswer) -> ProviderViewReply:
    """A provider's lookup answer as the view's reply."""
    return ProviderViewReply(
        answer=str(answer.kind), detail=answer.detail, ref=answer.ref, effect=dict(answer.body)
    )


async def answer(
    tools: Mapping[str, Tool], providers: Providers, request: ProviderViewRequest
) -> ProviderViewReply:
    """What the provider says about `request.key`, for one of `tools` (this family's)."""
    tool = tools.get(request.tool)
    if tool is None:
        return ProviderViewReply(answer="unknown", detail=f"{request.tool} is not a tool of this family")
    if not providers.can_look_up(tool):
        return ProviderViewReply(answer=NO_LOOKUP, detail=f"{tool.name}: no lookup by key")
    timeout = min(tool.contract.timeout_s, LOOKUP_TIMEOUT_S)
    return view_of(await providers.lookup(tool, request.key, timeout, args=request.args or None))


async def serve(
    broker: Broker,
    ns: Namespace,
    family: str,
    tools: Mapping[str, Tool],
    providers: Providers,
    logger: logging.Logger,
) -> Subscription:
    """Answer `<ns>.provider_view.<family>` until unsubscribed; a question that cannot be read, or a lookup
    that fails, is answered `unknown`, never left to crash the executor."""

    async def on_question(data: bytes) -> bytes:
        try:
            request = provider_view_request_decoder.decode(data)
            reply = await answer(tools, providers, request)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            reply = ProviderViewReply(answer="unknown", detail=f"unreadable question: {exc}")
        except Exception as exc:  # noqa: BLE001 -- a lookup that broke must not take the subscription down
            log(logger, logging.WARNING, "provider view failed", error=f"{type(exc).__name__}: {exc}")
            reply = ProviderViewReply(answer="unknown", detail=f"lookup failed: {type(exc).__name__}")
        return provider_view_encoder.encode(reply)

    return await broker.serve(ns.provider_view(family), f"provider_view_{family}", on_question)


async def ask(
    broker: Broker, ns: Namespace, tool: Tool, key: str, args: dict[str, Any], timeout_s: float = 6.0
) -> ProviderViewReply:
    """The provider's answer about `key`, through `tool`'s family's executors; `no_answer` if none replied."""
    request = ProviderViewRequest(tool=tool.name, key=key, args=args)
    try:
        data = await broker.request(
            ns.provider_view(tool.contract.family), provider_view_encoder.encode(request), timeout_s
        )
    except BrokerUnavailable as exc:
        why = type(exc.__cause__ or exc).__name__
        return ProviderViewReply(answer=NO_ANSWER, detail=f"provider did not answer ({why})")
    try:
        return provider_view_reply_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ProviderViewReply(answer=NO_ANSWER, detail="provider did not answer (an unreadable reply)")
