"""The Chat Completions dialect (vLLM, Ollama, LiteLLM speak only it): our Responses-shaped transcript and tools
translated to chat messages and function tools, and a chat answer read back into the same `ModelReply`."""

from __future__ import annotations

from typing import Any

import msgspec

from crashsafe.contracts.run_events import ToolCall
from crashsafe.domain.model_calls import ModelReply

# The Responses dialect's reader's error and token count (domain/responses_reading.py), one for both dialects.
from crashsafe.domain.responses_reading import MalformedAnswer, Tokens

# Roles the chat dialect knows; the Responses API's `developer` is a chat `system` message.
_ROLE = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def chat_messages(instructions: str, items: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The transcript as chat messages: consecutive function calls become one assistant message's `tool_calls`,
    each function output a `tool` message answering its call id."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": output if isinstance(output, str) else _text(output),
                }
            )
        else:
            role = _ROLE.get(str(item.get("role")), "user")
            messages.append({"role": role, "content": _text(item.get("content"))})
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools (name at the top) as chat function tools (name under `function`)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


class _Function(msgspec.Struct):
    name: str
    arguments: str = "{}"


class _ToolCall(msgspec.Struct):
    id: str
    function: _Function
    type: str = "function"


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Usage(msgspec.Struct):
    prompt_tokens: Tokens = 0
    completion_tokens: Tokens = 0


class _Completion(msgspec.Struct):
    """Only the fields of a chat completion the runtime reads."""

    id: str
    choices: list[_Choice]
    model: str = ""
    usage: _Usage | None = None


_decode_completion = msgspec.json.Decoder(_Completion).decode


def read_completion(raw: bytes, model: str) -> ModelReply:
    """A chat completion as a `ModelReply`; `MalformedAnswer` if it is not one (no choices, not JSON)."""
    try:
        completion = _decode_completion(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedAnswer(f"not a chat completion: {exc}") from exc
    if not completion.choices:
        raise MalformedAnswer("a chat completion with no choices")
    message = completion.choices[0].message
    calls = tuple(
        ToolCall(call_id=c.id, name=c.function.name, arguments=c.function.arguments)
        for c in message.tool_calls or ()
    )
    usage = completion.usage or _Usage()
    return ModelReply(
        model=completion.model or model,
        response_id=completion.id,
        tool_calls=calls,
        reply=(message.content or "") if message.content or not calls else None,
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
    )
