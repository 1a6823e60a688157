"""The model port and its gateway: each agent's routes from its pinned configuration, tried in order, over the
Responses API or Chat Completions, through the real `openai` client (real protocol)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute
from crashsafe.contracts.errors import ModelUnavailable
from crashsafe.contracts.run_events import ToolCall
from crashsafe.domain.agent import Agent
from crashsafe.domain.model_calls import ModelReply
from crashsafe.services.platform import metrics
from crashsafe.services.platform.settings import route_key
from crashsafe.services.runtime.chat_completions import (
    MalformedAnswer,
    Tokens,
    chat_messages,
    chat_tools,
    read_completion,
)
from crashsafe.services.runtime.fixed_model import fixed_answer

if TYPE_CHECKING:
    import openai

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_ROUTE = "default"
_MODEL_CALL_SECONDS = metrics.Children(metrics.MODEL_CALL_SECONDS)


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
_encode = msgspec.json.Encoder().encode


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


class _Refused(Exception):
    """A 4xx that is the request's fault (a 400, a 422), which another provider would refuse too (no failover)."""


# 4xx answers that speak of the route, not the request: its key expired or lacks access (401, 403), its model or
# path is unknown there (404), it is throttled (429). Another route, with its own key and provider, may answer.
_ROUTE_FAULTS = frozenset({401, 403, 404, 429})


def _openai() -> Any:
    """The `openai` package, imported where a client is made: importing this module stays cheap for the tools that
    read it (replay, the CLI); a runtime imports the package before it says ready (`load_client_library`)."""
    import openai

    return openai


def load_client_library() -> None:
    """Import `openai` (and httpx with it) now, in a worker thread at the runtime's start: a second of CPU that,
    paid at the first model call, held the event loop past the ack wait, and every message in hand came again."""
    _openai()
    _httpx_response()


def _httpx_response() -> Any:
    """The raw-answer type the client is asked for (httpx comes with `openai`, and is imported with it)."""
    import httpx

    return httpx.Response


def _client_errors() -> tuple[type[BaseException], ...]:
    """The `openai` client's errors, once a client exists (before, none can be raised)."""
    loaded = sys.modules.get("openai")
    return (loaded.OpenAIError,) if loaded is not None else ()


def _failures() -> tuple[type[BaseException], ...]:
    """What a route may fail with that fails over to the next route."""
    return (TimeoutError, MalformedAnswer, _NoKey, *_client_errors())


class _NoKey(Exception):
    """A route whose key variable is unset: that route cannot be asked, the next one may."""


class ModelGateway:
    """Asks a run's model routes in order until one answers usably.

    Each route's client is an `openai.AsyncOpenAI` (one per base URL and key variable, `max_retries=0`: the
    runtime owns retries, a redelivered message asks again). Bodies are encoded with msgspec and answers decoded
    into the few fields we read: the client's own request transform and response models re-walk the whole
    transcript every step and cost most of a typical run's CPU, while auth, base URL and error mapping still
    come from the client. With no routes configured, the deployment's CRASHSAFE_MODEL at OPENAI_BASE_URL."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout_s: float = 30.0,
        *,
        keys: Callable[[str], str | None] = route_key,
    ) -> None:
        self._base_url = base_url or ""
        self._api_key = api_key
        self._keys = keys  # a route's key by its variable's name (the environment, read by Settings)
        self.model = model
        self.default_route = ModelRoute(name=DEFAULT_ROUTE, model=model, timeout_s=timeout_s)
        self._clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}  # made on first use (`_openai`)
        self._tools: dict[tuple[str, tuple[str, ...], str], list[dict[str, Any]]] = {}

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    def _client(self, route: ModelRoute) -> openai.AsyncOpenAI:
        base_url = route.base_url or self._base_url
        client = self._clients.get((base_url, route.api_key_env))
        if client is None:
            key = self._keys(route.api_key_env) or (
                self._api_key if route.api_key_env == DEFAULT_KEY_ENV else None
            )
            if not key:
                raise _NoKey(f"no API key: set ${route.api_key_env}")
            # aiohttp underneath (the client's own supported transport): httpcore cost half the runtime's CPU.
            sdk = _openai()
            client = self._clients[(base_url, route.api_key_env)] = sdk.AsyncOpenAI(
                base_url=base_url or None,
                api_key=key,
                max_retries=0,
                http_client=sdk.DefaultAioHttpClient(),
            )
        return client

    def _tools_for(self, agent: Agent, config: AgentConfig, api: str) -> list[dict[str, Any]]:
        """The tools offered: the configuration's `tools` (empty: every model tool of the agent)."""
        names = tuple(config.tools)
        tools = self._tools.get((agent.name, names, api))
        if tools is None:
            chosen = [agent.tools[n] for n in names if n in agent.tools] if names else agent.tools.values()
            responses = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in chosen
            ]
            tools = self._tools[(agent.name, names, api)] = (
                chat_tools(responses) if api == ModelApi.CHAT else responses
            )
        return tools

    async def answer(
        self,
        agent: Agent,
        items: tuple[dict[str, Any], ...],
        config: AgentConfig | None = None,
        deadline_at: datetime | None = None,
    ) -> ModelReply:
        config = config or agent.config
        routes = config.routes or [self.default_route]
        instructions = config.instructions or agent.instructions
        failovers: list[str] = []
        for route in routes:
            timeout_s = route.timeout_s
            if deadline_at is not None:
                timeout_s = min(timeout_s, (deadline_at - datetime.now(UTC)).total_seconds())
            if timeout_s <= 0:
                failovers.append(f"{route.name}: no time left before the run's deadline")
                break
            asked_at = time.perf_counter()
            try:
                reply = await self._ask(route, agent, config, instructions, items, timeout_s)
            except _Refused as exc:
                _MODEL_CALL_SECONDS(route.name, "refused").observe(time.perf_counter() - asked_at)
                raise ModelUnavailable(
                    "; ".join([*failovers, f"{route.name} refused the request: {exc}"]), model=route.model
                ) from exc
            except _failures() as exc:
                # The last route's failure is the run's: "down"; an earlier one's is a failover to the next.
                outcome = "down" if route is routes[-1] else "failover"
                _MODEL_CALL_SECONDS(route.name, outcome).observe(time.perf_counter() - asked_at)
                failovers.append(f"{route.name}: {_why(exc, timeout_s)}")
                metrics.MODEL_FAILOVERS.labels(route=route.name).inc()
                continue
            _MODEL_CALL_SECONDS(route.name, "ok").observe(time.perf_counter() - asked_at)
            return ModelReply(
                model=reply.model,
                response_id=reply.response_id,
                tool_calls=reply.tool_calls,
                reply=reply.reply,
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                provider=route.name,
                failovers=tuple(failovers),
            )
        raise ModelUnavailable(
            f"no model route answered ({'; '.join(failovers)})", model=",".join(r.model for r in routes)
        )

    async def _ask(
        self,
        route: ModelRoute,
        agent: Agent,
        config: AgentConfig,
        instructions: str,
        items: tuple[dict[str, Any], ...],
        timeout_s: float,
    ) -> ModelReply:
        if route.api == ModelApi.FIXED:
            return read_response(fixed_answer(items, route.model), route.model)
        client = self._client(route)
        chat = route.api == ModelApi.CHAT
        body: dict[str, Any]
        if chat:
            body = {
                "model": route.model,
                "messages": chat_messages(instructions, items),
                "tools": self._tools_for(agent, config, route.api),
                "parallel_tool_calls": False,
            }
        else:
            body = {
                "model": route.model,
                "input": list(items),
                "tools": self._tools_for(agent, config, route.api),
                "parallel_tool_calls": False,
            }
            if instructions:
                body["instructions"] = instructions
        # A total bound (httpx's timeout is per phase: a trickling answer could outlive it), and the client's
        # own, so a connect that never completes is also cut there.
        try:
            async with asyncio.timeout(timeout_s):
                raw = await client.post(
                    "/chat/completions" if chat else "/responses",
                    cast_to=_httpx_response(),
                    content=_encode(body),
                    options={"headers": {"Content-Type": "application/json"}, "timeout": timeout_s},
                )
        except _openai().APIStatusError as exc:
            if 400 <= exc.status_code < 500 and exc.status_code not in _ROUTE_FAULTS:
                raise _Refused(f"{exc.status_code} {exc.message}") from exc
            raise
        return read_completion(raw.content, route.model) if chat else read_response(raw.content, route.model)


def _why(exc: BaseException, timeout_s: float) -> str:
    """A failover's reason as the journal keeps it: short, and naming what happened."""
    if isinstance(exc, _client_errors()):
        return _why_client(exc, timeout_s)
    match exc:
        case TimeoutError():
            return f"timed out after {timeout_s:.1f}s"
        case MalformedAnswer():
            return f"malformed answer: {exc}"[:200]
        case _NoKey():
            return str(exc)
        case _:
            return f"{type(exc).__name__}: {exc}"[:200]


def _why_client(exc: BaseException, timeout_s: float) -> str:
    openai = _openai()
    match exc:
        case openai.APITimeoutError() if type(exc.__cause__).__name__ == "ConnectTimeout":
            # The aiohttp transport reports a refused connection as a connect timeout (of whichever httpx the
            # client bundles, hence the name): say what it was.
            return f"connection failed: {exc.__cause__}"[:200]
        case openai.APITimeoutError():
            return f"timed out after {timeout_s:.1f}s"
        case openai.APIStatusError():
            return f"answered {exc.status_code}"
        case openai.APIConnectionError():
            return f"connection failed: {exc}"[:200]
        case _:
            return f"{type(exc).__name__}: {exc}"[:200]


# The name the runtime's callers knew before routes: the gateway still speaks the Responses API by default.
ResponsesModel = ModelGateway
