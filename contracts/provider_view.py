"""The provider's by-key view, asked over NATS request/reply: what a provider answers about one idempotency key.

The gateway (the console's run page) holds no provider credentials: it asks the tool family's executors on
`<ns>.provider_view.<family>`, which look the key up through the tool's lookup path and answer, read-only."""

from __future__ import annotations

from typing import Any

import msgspec


class ProviderViewRequest(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="provider_view.request"
):
    tool: str
    key: str
    # The request's arguments (a KV-backed tool's record is named by them); the journaled ones, never a guess.
    args: dict[str, Any] = {}


class ProviderViewReply(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", tag="provider_view.reply"
):
    # found | absent | unknown (crashsafe.contracts.tool_messages.Answer) or `no_lookup`: the tool cannot be asked by key.
    answer: str
    detail: str = ""
    ref: str | None = None
    effect: dict[str, Any] = {}


NO_LOOKUP = "no_lookup"

provider_view_encoder = msgspec.json.Encoder()
provider_view_request_decoder = msgspec.json.Decoder(ProviderViewRequest)
provider_view_reply_decoder = msgspec.json.Decoder(ProviderViewReply)
