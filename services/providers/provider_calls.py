"""The providers' HTTP adapter: carries out a tool's operation with its key, and asks a provider about a key."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from httpx_aiohttp import HttpxAiohttpClient
from opentelemetry.context import Context

from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.spans import SpanAttr, SpanName
from crashsafe.contracts.subjects import Header
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.registry import HttpOperation, KvOperation, LocalOperation, ProviderAnswer, Tool
from crashsafe.services.platform.tracing import annotate, current, failed, headers_for, span
from crashsafe.services.providers.kv_effects import KvEffects

# Statuses that say "not now" about the request, not "no" to it: the provider may or may not have acted.
_NOT_NOW = frozenset({408, 425, 429})
_MAX_RETRY_AFTER_S = 60.0
# A whole call (connect, send, every read) may take this many times the tool's timeout, which bounds each step.
_WHOLE_CALL = 2.0


def _json(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _provider_error(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """The provider's own typed error (`{"error": {"code": "...", ...}}`); None for any other shape, which a
    proxy, a load balancer or a framework in front of it may have written."""
    error = body.get("error") if body is not None else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and error["code"]:
        return error
    return None


def retry_after_s(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (delta-seconds or an HTTP date), bounded; None if absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def _unknown(response: httpx.Response, why: str) -> ProviderAnswer:
    return ProviderAnswer(
        Answer.UNKNOWN,
        {},
        detail=f"provider answered {response.status_code}{why}",
        retry_after_s=retry_after_s(response),
    )


def _by_status(operation: HttpOperation, record: dict[str, Any], found: Answer) -> ProviderAnswer:
    """A record the provider holds, read by its own status: refused, not decided yet, or done."""
    status = record.get(operation.status_field)
    ref = record.get(operation.ref_field) if operation.ref_field else None
    if isinstance(status, str) and status in operation.failed_statuses:
        error = {
            "code": status,
            "message": f"the provider holds this record as {status}",
            "record": record,
        }
        return ProviderAnswer(
            Answer.REJECTED, error, ref=str(ref) if ref else None, detail=f"record {status}"
        )
    if isinstance(status, str) and status in operation.pending_statuses:
        return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"the provider holds the record as {status}")
    return ProviderAnswer(found, record, ref=str(ref) if ref else None)  # type: ignore[arg-type]


def read_answer(response: httpx.Response, operation: HttpOperation) -> ProviderAnswer:
    """What a provider's answer to a call means. Only its typed refusal is a failure; 5xx, 408, 429, a key in
    use and any body that is not the provider's are unknown (the write may or may not have happened)."""
    status = response.status_code
    if status >= 500 or status in _NOT_NOW:
        return _unknown(response, "")
    body = _json(response)
    if body is None:
        return _unknown(response, " with a body that is not JSON")
    if 200 <= status < 300:
        answer = _by_status(operation, body, Answer.OK)
        if response.headers.get(Header.IDEMPOTENT_REPLAYED.value, "").lower() == "true":
            return dataclasses.replace(answer, replayed=True)
        return answer
    error = _provider_error(body)
    if status < 400 or error is None:
        return _unknown(response, " with a body that is not the provider's")
    if error["code"] in operation.in_use_codes:
        return _unknown(response, f" {error['code']}: an earlier request with this key is still in progress")
    return ProviderAnswer(Answer.REJECTED, error, detail=f"provider answered {status}")


def read_lookup(response: httpx.Response, operation: HttpOperation) -> ProviderAnswer:
    """What a provider's answer to "what became of key K?" means. Absent only from its typed "no such key";
    a bare 404 (a wrong route, a gateway), an expired key or anything else unreadable is unknown."""
    status = response.status_code
    body = _json(response)
    error = _provider_error(body)
    if status == 404 and error is not None and error["code"] in operation.absent_codes:
        return ProviderAnswer(Answer.ABSENT, {}, detail=f"provider: {error['code']}")
    if 200 <= status < 300 and body is not None:
        return _by_status(operation, body, Answer.FOUND)
    if error is not None:
        return _unknown(response, f" {error['code']}")
    return _unknown(
        response, " with a body that is not the provider's" if body is None or status < 500 else ""
    )


def _noted(ctx: Context, answer: ProviderAnswer) -> None:
    """The answer's kind on the span; one we cannot trust (unknown) marks it failed, a typed refusal does not."""
    annotate(ctx, **{SpanAttr.OUTCOME: answer.kind})
    if answer.kind == Answer.UNKNOWN:
        failed(ctx, answer.detail or "unknown outcome")


class Providers:
    """Every provider a deployment's tools talk to, behind one HTTP client with keep-alive connections."""

    def __init__(self, http: httpx.AsyncClient, kv: KvEffects | None = None) -> None:
        self.http = http
        # The key-value records a KV-backed tool rewrites (a guest's profile); None: this process has no
        # access to them, and such a tool's answers are unknown (never a guess).
        self.kv = kv

    @classmethod
    def connect(cls, base_url: str, kv: KvEffects | None = None) -> Providers:
        # httpx's API on an aiohttp transport: httpcore cost half an executor's CPU.
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
        return cls(HttpxAiohttpClient(base_url=base_url, limits=limits), kv)

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Providers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(
        self, tool: Tool, request: ActionRequest, timeout: float, *, ctx: Context | None = None
    ) -> ProviderAnswer:
        """Carry out the effect once, with the request's key; an answer we cannot trust is `unknown`. An HTTP
        call is a `provider.call` span under `ctx` (else the task's current span), its context sent along."""
        match tool.operation:
            case LocalOperation(run=run):
                return ProviderAnswer(Answer.OK, await run(request.args, request.key), ref=request.key)
            case KvOperation() as kv_operation:
                if self.kv is None:
                    return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{tool.name}: no key-value access here")
                return await self.kv.call(kv_operation, request)
            case HttpOperation() as operation:
                http = operation.request(request.args)
                with span(
                    SpanName.PROVIDER_CALL,
                    ctx if ctx is not None else current(),
                    run_id=request.run_id,
                    step_no=request.step_no or None,  # a projection's request has no step
                    idempotency_key=request.key,
                    tool=tool.name,
                    **{SpanAttr.HTTP_METHOD: http.method, SpanAttr.HTTP_ROUTE: http.path},
                ) as sent:
                    headers = headers_for(sent)
                    headers[Header.IDEMPOTENCY_KEY.value] = request.key
                    if account := request.args.get(ACCOUNT_ARG):
                        headers[Header.PROVIDER_ACCOUNT.value] = str(account)
                    try:
                        # The client's timeout bounds each read, not the answer: one trickled a byte at a time
                        # would hold the call (and the worker's slot and claim) for ever. The whole call too.
                        async with asyncio.timeout(timeout * _WHOLE_CALL):
                            response = await self.http.request(
                                http.method,
                                http.path,
                                json=http.json,
                                params=http.params,
                                headers=headers,
                                timeout=timeout,
                            )
                    except (httpx.HTTPError, TimeoutError) as exc:
                        # Timeout or dropped connection after sending: the provider may or may not have done it.
                        answer = ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{type(exc).__name__}: {exc}")
                    else:
                        annotate(sent, **{SpanAttr.HTTP_STATUS: response.status_code})
                        answer = read_answer(response, operation)
                    _noted(sent, answer)
                    return answer

    def can_look_up(self, tool: Tool) -> bool:
        """A local effect leaves nothing to ask about: asking says `absent`, and calling again is the same as once."""
        if isinstance(tool.operation, LocalOperation | KvOperation):
            return True
        return tool.operation.lookup_path is not None

    async def lookup(
        self,
        tool: Tool,
        key: str,
        timeout: float,
        args: dict[str, Any] | None = None,
        *,
        ctx: Context | None = None,
    ) -> ProviderAnswer:
        """What happened to `key`: found (with the effect), absent (never seen), or unknown (no answer to trust).
        `args`: the request's, which name the record a KV-backed tool wrote (without them: unknown) and the
        provider account an HTTP tool's write acted in (its `Provider-Account`)."""
        match tool.operation:
            case LocalOperation():
                return ProviderAnswer(Answer.ABSENT, {})
            case KvOperation() as kv_operation:
                if self.kv is None or args is None:
                    return ProviderAnswer(
                        Answer.UNKNOWN, {}, detail=f"{tool.name}: cannot read its record here"
                    )
                return await self.kv.lookup(kv_operation, key, args)
            case HttpOperation(lookup_path=None):
                return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{tool.name} has no lookup by key")
            case HttpOperation(lookup_path=str(path)) as operation:
                with span(
                    SpanName.PROVIDER_CALL,
                    ctx if ctx is not None else current(),
                    idempotency_key=key,
                    tool=tool.name,
                    **{SpanAttr.HTTP_METHOD: "GET", SpanAttr.HTTP_ROUTE: path},
                ) as asked:
                    headers = headers_for(asked)
                    # Asked in the account the write acted in: a provider keeps each account's keys apart, so
                    # asked in another (or the default) a tenant's effect would read as never made.
                    if account := (args or {}).get(ACCOUNT_ARG):
                        headers[Header.PROVIDER_ACCOUNT.value] = str(account)
                    try:
                        async with asyncio.timeout(timeout * _WHOLE_CALL):
                            response = await self.http.get(
                                path.format(key=key), headers=headers, timeout=timeout
                            )
                    except (httpx.HTTPError, TimeoutError) as exc:
                        answer = ProviderAnswer(
                            Answer.UNKNOWN, {}, detail=f"lookup failed: {type(exc).__name__}: {exc}"
                        )
                    else:
                        annotate(asked, **{SpanAttr.HTTP_STATUS: response.status_code})
                        answer = read_lookup(response, operation)
                    _noted(asked, answer)
                    return answer
        raise AssertionError(f"unhandled operation {tool.operation!r}")
