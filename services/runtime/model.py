"""The model port and its OpenAI Responses API adapter (the real `openai` client, real protocol)."""

from __future__ import annotations

from typing import Any, Protocol

import openai

from contracts.errors import ModelUnavailable
from contracts.run_events import ToolCall
from services.runtime.core.agent import Agent
from services.runtime.core.decide import ModelReply


class Model(Protocol):
    async def answer(self, agent: Agent, items: tuple[dict[str, Any], ...]) -> ModelReply: ...


class ResponsesModel:
    """Asks an OpenAI-compatible Responses endpoint; the sandbox's scripted model speaks the same protocol."""

    def __init__(self, base_url: str | None, api_key: str | None, model: str, timeout_s: float = 30.0) -> None:
        # The runtime owns retries (the message is redelivered); the client must not retry on its own.
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
        self.model = model

    async def close(self) -> None:
        await self._client.close()

    async def answer(self, agent: Agent, items: tuple[dict[str, Any], ...]) -> ModelReply:
        tools = [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters, "strict": False}
            for t in agent.tools.values()
        ]
        try:
            response = await self._client.responses.create(
                model=self.model,
                instructions=agent.instructions or None,
                input=list(items),  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
                parallel_tool_calls=False,
            )
        except openai.OpenAIError as exc:
            raise ModelUnavailable(f"model {self.model} did not answer: {exc}", model=self.model) from exc
        calls: list[ToolCall] = []
        texts: list[str] = []
        for item in response.output:
            if item.type == "function_call":
                calls.append(ToolCall(call_id=item.call_id, name=item.name, arguments=item.arguments))
            elif item.type == "message":
                texts.extend(part.text for part in item.content if part.type == "output_text")
        usage = response.usage
        return ModelReply(
            model=response.model or self.model,
            response_id=response.id,
            tool_calls=tuple(calls),
            reply="".join(texts) if texts or not calls else None,
            input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0,
        )
