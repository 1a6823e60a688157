"""The providers' HTTP adapter: carries out a tool's operation with its key, and asks a provider about a key."""

from __future__ import annotations

from typing import Any

import httpx
from httpx_aiohttp import HttpxAiohttpClient

from contracts.subjects import Header
from contracts.tool_messages import ActionRequest, Answer
from services.registry import ProviderAnswer
from services.registry import HttpOperation, LocalOperation, Tool


def _json(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def read_answer(response: httpx.Response, ref_field: str | None) -> ProviderAnswer:
    """What a provider's HTTP answer means: 5xx or a body we cannot read is unknown, never a failure."""
    body = _json(response)
    if response.status_code >= 500:
        return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"provider answered {response.status_code}")
    if body is None:
        return ProviderAnswer(
            Answer.UNKNOWN,
            {},
            detail=f"provider answered {response.status_code} with a body that is not JSON",
        )
    if 200 <= response.status_code < 300:
        return ProviderAnswer(
            Answer.OK, body, ref=str(body.get(ref_field)) if ref_field and body.get(ref_field) else None
        )
    error = body.get("error", body)
    return ProviderAnswer(
        Answer.REJECTED,
        error if isinstance(error, dict) else {"message": str(error)},
        detail=f"provider answered {response.status_code}",
    )


class Providers:
    """Every provider a deployment's tools talk to, behind one HTTP client with keep-alive connections."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    @classmethod
    def connect(cls, base_url: str) -> Providers:
        # httpx's API on an aiohttp transport: httpcore cost half an executor's CPU.
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
        return cls(HttpxAiohttpClient(base_url=base_url, limits=limits))

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Providers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, tool: Tool, request: ActionRequest, timeout: float) -> ProviderAnswer:
        """Carry out the effect once, with the request's key; an answer we cannot trust is `unknown`."""
        match tool.operation:
            case LocalOperation(run=run):
                return ProviderAnswer(Answer.OK, await run(request.args, request.key), ref=request.key)
            case HttpOperation() as operation:
                http = operation.request(request.args)
                try:
                    response = await self.http.request(
                        http.method,
                        http.path,
                        json=http.json,
                        params=http.params,
                        headers={Header.IDEMPOTENCY_KEY.value: request.key},
                        timeout=timeout,
                    )
                except httpx.HTTPError as exc:
                    # Timeout or dropped connection after sending: the provider may or may not have committed it.
                    return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{type(exc).__name__}: {exc}")
                return read_answer(response, operation.ref_field)

    def can_look_up(self, tool: Tool) -> bool:
        """A local effect leaves nothing to ask about: asking says `absent`, and calling again is the same as once."""
        return isinstance(tool.operation, LocalOperation) or tool.operation.lookup_path is not None

    async def lookup(self, tool: Tool, key: str, timeout: float) -> ProviderAnswer:
        """What happened to `key`: found (with the effect), absent (never seen), or unknown (no answer to trust)."""
        match tool.operation:
            case LocalOperation():
                return ProviderAnswer(Answer.ABSENT, {})
            case HttpOperation(lookup_path=None):
                return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{tool.name} has no lookup by key")
            case HttpOperation(lookup_path=str(path), ref_field=ref_field):
                try:
                    response = await self.http.get(path.format(key=key), timeout=timeout)
                except httpx.HTTPError as exc:
                    return ProviderAnswer(
                        Answer.UNKNOWN, {}, detail=f"lookup failed: {type(exc).__name__}: {exc}"
                    )
                if response.status_code == 404:
                    return ProviderAnswer(Answer.ABSENT, {})
                answer = read_answer(response, ref_field)
                if answer.kind == Answer.OK:
                    return ProviderAnswer(Answer.FOUND, answer.body, answer.ref)
                return ProviderAnswer(Answer.UNKNOWN, {}, detail=answer.detail)
        raise AssertionError(f"unhandled operation {tool.operation!r}")
