"""A Responses API object read as a model's answer: the one reader the runtime's model port and a replay of recorded
answers (`crashsafe.testing.read_responses`) share, so a recording plays as the runtime would journal it. Pure."""

from __future__ import annotations

from typing import Annotated

import msgspec

from crashsafe.contracts.run_events import ToolCall
from crashsafe.domain.model_calls import ModelReply

# A count of tokens is never negative: a provider that says so would hand the run back its token budget.
Tokens = Annotated[int, msgspec.Meta(ge=0)]


class MalformedAnswer(ValueError):
    """The provider answered 2xx with something that is not a usable answer: the next route is asked."""


class _Usage(msgspec.Struct):
    input_tokens: Tokens = 0
    output_tokens: Tokens = 0


class _Part(msgspec.Struct):
    type: str
    text: str = ""


class _Item(msgspec.Struct):
    type: str
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    content: list[_Part] = []


class _Response(msgspec.Struct):
    """Only the fields of a Responses API answer the runtime reads; everything else is skipped unparsed."""

    id: str
    model: str = ""
    output: list[_Item] = []
    usage: _Usage | None = None


_decode_response = msgspec.json.Decoder(_Response).decode


def read_response(raw: bytes, model: str) -> ModelReply:
    """A Responses API object as a `ModelReply`; `MalformedAnswer` if it is not one."""
    try:
        response = _decode_response(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedAnswer(f"not a Responses object: {exc}") from exc
    calls = tuple(
        ToolCall(call_id=item.call_id, name=item.name, arguments=item.arguments)
        for item in response.output
        if item.type == "function_call"
    )
    texts = [
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    ]
    usage = response.usage or _Usage()
    return ModelReply(
        model=response.model or model,
        response_id=response.id,
        tool_calls=calls,
        reply="".join(texts) if texts or not calls else None,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )
