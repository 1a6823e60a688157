"""The model port and its OpenAI Responses API adapter (the real `openai` client, real protocol)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import httpx
import msgspec
import openai

from contracts.catalog import AgentConfig
from contracts.errors import ModelUnavailable
from contracts.run_events import ToolCall
from services.runtime.core.agent import Agent
from services.runtime.core.decide import ModelReply


class Model(Protocol):
    async def answer(
        self,
        agent: Agent,
        items: tuple[dict[str, Any], ...],
        config: AgentConfig | None = None,
        deadline_at: datetime | None = None,
    ) -> ModelReply:
        """`config`: the run's pinned configuration (its routes, prompt and tools); `deadline_at`: the run's
        deadline, which bounds each call's timeout."""
        ...


class _Usage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0


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
_encode = msgspec.json.Encoder().encode


class ResponsesModel:
    """Asks an OpenAI-compatible Responses endpoint through the `openai` client; the scripted model speaks the same.

    The body is encoded with msgspec and the answer decoded into the few fields we use: the client's own request
    transform and response models re-walk the whole transcript every step and cost most of a booking run's CPU,
    while auth, base URL, timeouts and error mapping still come from the client."""

    def __init__(
        self, base_url: str | None, api_key: str | None, model: str, timeout_s: float = 30.0
    ) -> None:
        # The runtime owns retries (the message is redelivered); the client must not retry on its own.
        # aiohttp underneath (the client's own supported transport): httpcore cost half the runtime's CPU.
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(),
        )
        self.model = model
        self._tools: dict[str, list[dict[str, Any]]] = {}

    async def close(self) -> None:
        await self._client.close()

    def _tools_for(self, agent: Agent) -> list[dict[str, Any]]:
        tools = self._tools.get(agent.name)
        if tools is None:
            tools = self._tools[agent.name] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in agent.tools.values()
            ]
        return tools

    async def answer(
        self,
        agent: Agent,
        items: tuple[dict[str, Any], ...],
        config: AgentConfig | None = None,
        deadline_at: datetime | None = None,
    ) -> ModelReply:
        body: dict[str, Any] = {
            "model": self.model,
            "input": list(items),
            "tools": self._tools_for(agent),
            "parallel_tool_calls": False,
        }
        if agent.instructions:
            body["instructions"] = agent.instructions
        try:
            raw = await self._client.post(
                "/responses",
                cast_to=httpx.Response,
                content=_encode(body),
                options={"headers": {"Content-Type": "application/json"}},
            )
            response = _decode_response(raw.content)
        except openai.OpenAIError as exc:
            raise ModelUnavailable(f"model {self.model} did not answer: {exc}", model=self.model) from exc
        except msgspec.DecodeError as exc:
            raise ModelUnavailable(
                f"model {self.model} answered something that is not a Responses object: {exc}",
                model=self.model,
            ) from exc
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
            model=response.model or self.model,
            response_id=response.id,
            tool_calls=calls,
            reply="".join(texts) if texts or not calls else None,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )
