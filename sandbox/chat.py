"""The scripted model on the Chat Completions protocol: chat messages in as Responses input items, the scripted
answer out as a chat completion, so a route with `api: chat_completions` meets the same script."""

from __future__ import annotations

from typing import Any

from crashsafe.sandbox import scripted_model


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as the Responses input items the script reads. A leading system message is the
    instructions (the Responses endpoint gets them apart from the input) and is left out; a later one is a
    developer message (context, retrieved passages), which the Responses dialect keeps in the input."""
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system":
            if index:
                items.append({"role": "developer", "content": _text(message.get("content"))})
            continue
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(message.get("tool_call_id", "")),
                    "output": _text(message.get("content")),
                }
            )
        elif role == "assistant":
            if message.get("content"):
                items.append({"role": "assistant", "content": _text(message.get("content"))})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id", "")),
                        "name": str(function.get("name", "")),
                        "arguments": str(function.get("arguments") or "{}"),
                    }
                )
        elif role in ("user", "developer"):
            items.append({"role": role, "content": _text(message.get("content"))})
    return items


def respond(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    model: str = scripted_model.MODEL_NAME,
) -> dict[str, Any]:
    """A complete chat completion object for `messages`, the script's answer to the same conversation."""
    answer = scripted_model.respond(input_items(messages), tools, model=model)
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in answer["output"]
        if item["type"] == "function_call"
    ]
    text = "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    usage = answer["usage"]
    return {
        "id": "chatcmpl-" + answer["id"].removeprefix("resp_"),
        "object": "chat.completion",
        "created": answer["created_at"],
        "model": answer["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    }
