"""The model port and its gateway: each agent's routes from its pinned configuration, tried in order, over the
Responses API or Chat Completions (real protocol: what each request carries is the `openai` SDK's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import msgspec

from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute
from crashsafe.contracts.errors import ModelUnavailable
from crashsafe.domain.agent import Agent
from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.responses_reading import MalformedAnswer, read_response
from crashsafe.services.platform import metrics
from crashsafe.services.platform.provider_http import ProviderHttp
from crashsafe.services.platform.settings import route_key
from crashsafe.services.runtime.chat_completions import chat_messages, chat_tools, read_completion
from crashsafe.services.runtime.fixed_model import fixed_answer

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


_encode = msgspec.json.Encoder().encode


class _Refused(Exception):
    """A 4xx that is the request's fault (a 400, a 422), which another provider would refuse too (no failover)."""


# 4xx answers that speak of the route, not the request: its key expired or lacks access (401, 403), its model or
# path is unknown there (404), it is throttled (429). Another route, with its own key and provider, may answer.
_ROUTE_FAULTS = frozenset({401, 403, 404, 429})


# The OpenAI API's base URL when a deployment names none (what the `openai` SDK defaults to).
OPENAI_API_URL = "https://api.openai.com/v1"


class _NoKey(Exception):
    """A route whose key variable is unset: that route cannot be asked, the next one may."""


class _Answered(Exception):
    """A route answered with a status that fails it over (a 5xx, or a 4xx of its own key or model)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"answered {status}")
        self.status = status


# What a route may fail with that fails over to the next route.
_FAILURES = (TimeoutError, MalformedAnswer, _NoKey, _Answered, aiohttp.ClientError)


@dataclass(frozen=True, slots=True)
class _RouteClient:
    """One API's HTTP client and what each request to it carries (the key, the organization and project)."""

    http: ProviderHttp
    headers: dict[str, str]


class ModelGateway:
    """Asks a run's model routes in order until one answers usably.

    One HTTP client per base URL and key variable (`ProviderHttp`, aiohttp, the product's one client of outside
    APIs; never retried: the runtime owns retries, a redelivered message asks again), sending what the `openai`
    SDK sent: `Authorization: Bearer <key>`, `OpenAI-Organization` and `OpenAI-Project` when the deployment sets
    them, JSON. Bodies are encoded with msgspec and answers decoded into the few fields we read. The SDK's request
    path (its request transform, httpx, its response models) cost 38 % of the runtime's CPU in the reference
    agent's bench, and importing it 22 MB of every service's memory. With no routes configured, the deployment's
    CRASHSAFE_MODEL at OPENAI_BASE_URL (else the OpenAI API's own)."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout_s: float = 30.0,
        *,
        keys: Callable[[str], str | None] = route_key,
        organization: str | None = None,
        project: str | None = None,
    ) -> None:
        self._base_url = base_url or ""
        # Sent on every call, whichever route (as the SDK sent OPENAI_ORG_ID and OPENAI_PROJECT_ID).
        self._identity = {
            name: value
            for name, value in (("OpenAI-Organization", organization), ("OpenAI-Project", project))
            if value
        }
        self._api_key = api_key
        self._keys = keys  # a route's key by its variable's name (the environment, read by Settings)
        self.model = model
        self.default_route = ModelRoute(name=DEFAULT_ROUTE, model=model, timeout_s=timeout_s)
        self._clients: dict[tuple[str, str], _RouteClient] = {}  # made on first use
        self._tools: dict[tuple[str, tuple[str, ...], str], list[dict[str, Any]]] = {}

    async def close(self) -> None:
        for client in self._clients.values():
            await client.http.close()
        self._clients.clear()

    def _client(self, route: ModelRoute) -> _RouteClient:
        base_url = route.base_url or self._base_url
        client = self._clients.get((base_url, route.api_key_env))
        if client is None:
            key = self._keys(route.api_key_env) or (
                self._api_key if route.api_key_env == DEFAULT_KEY_ENV else None
            )
            if not key:
                raise _NoKey(f"no API key: set ${route.api_key_env}")
            headers = {
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                **self._identity,
            }
            client = _RouteClient(ProviderHttp(base_url or OPENAI_API_URL), headers)
            self._clients[(base_url, route.api_key_env)] = client
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
            except _FAILURES as exc:
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
        # A total bound (the client's is per phase: a trickling answer could outlive it), and the client's own, so
        # a connect that never completes is also cut there.
        async with asyncio.timeout(timeout_s):
            answer = await client.http.request(
                "POST",
                "chat/completions" if chat else "responses",
                content=_encode(body),
                headers=client.headers,
                timeout=timeout_s,
            )
        status = answer.status_code
        if 400 <= status < 500 and status not in _ROUTE_FAULTS:
            raise _Refused(f"{status} {_error_message(answer.content)}")
        if not 200 <= status < 300:
            raise _Answered(status)
        return (
            read_completion(answer.content, route.model)
            if chat
            else read_response(answer.content, route.model)
        )


def _error_message(content: bytes) -> str:
    """What an API's error answer says (`{"error": {"message": ...}}`, OpenAI's shape), else its body's start."""
    try:
        error = msgspec.json.decode(content).get("error")
    except (msgspec.DecodeError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:200]
    return content[:200].decode(errors="replace")


def _why(exc: BaseException, timeout_s: float) -> str:
    """A failover's reason as the journal keeps it: short, and naming what happened."""
    match exc:
        case TimeoutError():
            return f"timed out after {timeout_s:.1f}s"
        case _Answered():
            return str(exc)
        case MalformedAnswer():
            return f"malformed answer: {exc}"[:200]
        case _NoKey():
            return str(exc)
        case aiohttp.ClientError():
            return f"connection failed: {type(exc).__name__}: {exc}"[:200]
        case _:
            return f"{type(exc).__name__}: {exc}"[:200]


# The name the runtime's callers knew before routes: the gateway still speaks the Responses API by default.
ResponsesModel = ModelGateway
