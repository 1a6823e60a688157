"""The providers' adapter: carries out a tool's operation with its key (over HTTP, as an adopter's Python code, as a
KV write), and asks a provider about a key; one HTTP client per base URL, each provider with its credential. What
an operation must answer: docs/providers.md."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, cast

import aiohttp
from opentelemetry.context import Context

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.headers import Header
from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.provider_settings import (
    DEFAULT_PROVIDER,
    ProviderSettings,
    credential_variable,
    unmaskable,
    url_variable,
)
from crashsafe.contracts.spans import SpanAttr, SpanName
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.credential_masks import CredentialMask
from crashsafe.domain.registry import (
    HttpOperation,
    KvOperation,
    ListingClient,
    LocalOperation,
    ProviderAnswer,
    ProviderClient,
    PythonOperation,
    Tool,
)
from crashsafe.services.platform.hook_limit import HookLimit
from crashsafe.services.platform.provider_http import ProviderHttp
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import annotate, current, failed, headers_for, span
from crashsafe.services.providers import legacy_clients, python_calls
from crashsafe.services.providers.http_answers import read_answer, read_lookup
from crashsafe.services.providers.kv_effects import KvEffects

# A whole call (connect, send, every read) may take this many times the tool's timeout, which bounds each step.
_WHOLE_CALL = 2.0


def _noted(ctx: Context, answer: ProviderAnswer) -> None:
    """The answer's kind on the span; one we cannot trust (unknown) marks it failed, a typed refusal does not."""
    annotate(ctx, **{SpanAttr.OUTCOME: answer.kind})
    if answer.kind == Answer.UNKNOWN:
        failed(ctx, answer.detail or "unknown outcome")


def endpoints_for(settings: Settings, tools: Iterable[Tool]) -> dict[str, ProviderSettings]:
    """The settings of every provider `tools` name, checked at start: an HTTP operation's provider without a base
    URL, or a Python operation's provider nothing configures, is an InvalidSetting naming the variable to set."""
    endpoints: dict[str, ProviderSettings] = {}
    for tool in tools:
        match tool.operation:
            case HttpOperation(provider=name) | PythonOperation(provider=name):
                found = settings.provider(name)
                http = isinstance(tool.operation, HttpOperation)
                if found is None or (http and not found.base_url):
                    also = "" if http else f" (or its {credential_variable(name)})"
                    raise InvalidSetting(
                        variable=url_variable(name),
                        value="",
                        expected=f"the base URL of provider {name!r}{also}: tool {tool.name!r} names it",
                    )
                endpoints[name] = found
    default = settings.provider(DEFAULT_PROVIDER)
    assert default is not None  # always configured, at sandbox_url
    endpoints.setdefault(DEFAULT_PROVIDER, default)
    return endpoints


class Providers:
    """Every provider a deployment's tools talk to: one HTTP client with keep-alive connections per base URL, the
    adopters' Python clients (one per tool, opened with their provider's settings), the KV records."""

    def __init__(self, endpoints: Mapping[str, ProviderSettings], kv: KvEffects | None = None) -> None:
        self.endpoints = dict(endpoints)
        self._http: dict[str, ProviderHttp] = {}
        for endpoint in self.endpoints.values():
            if endpoint.base_url and endpoint.base_url not in self._http:
                self._http[endpoint.base_url] = ProviderHttp(endpoint.base_url)
        self._python: dict[str, ProviderClient] = {}
        # Each credential's masks, built once here: every answer is masked before it is journaled or shown.
        self._masks: dict[str, CredentialMask] = {}
        for name, endpoint in self.endpoints.items():
            if endpoint.credential:
                if why := unmaskable(endpoint.credential):
                    raise InvalidSetting(
                        variable=credential_variable(name), value="(not shown)", expected=why
                    )
                self._masks[name] = CredentialMask.of(endpoint.credential)
        # The key-value records a KV-backed tool rewrites (a guest's profile); None: this process has no
        # access to them, and such a tool's answers are unknown (never a guess).
        self.kv = kv
        # The limit on a Python operation's code between two awaits; unbounded unless the composition root, which
        # owns the process's SIGALRM, installs one (services/platform/hook_limit.py).
        self.code_limit: HookLimit | None = None

    @classmethod
    def connect(cls, base_url: str, kv: KvEffects | None = None) -> Providers:
        """The default provider alone, at `base_url` (a test's sandbox; the soak's)."""
        return cls({DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, base_url)}, kv)

    @classmethod
    def open(cls, settings: Settings, tools: Iterable[Tool], kv: KvEffects | None = None) -> Providers:
        """The providers `tools` need, checked before anything is served (see `endpoints_for`), each Python
        operation's client opened now: one that cannot open is an InvalidSetting naming its provider's variable."""
        tools = list(tools)
        providers = cls(endpoints_for(settings, tools), kv)
        for tool in tools:
            if isinstance(tool.operation, PythonOperation):
                try:
                    providers._opened(tool, tool.operation)
                except Exception as exc:  # noqa: BLE001 -- the adopter's constructor, reported as a setting
                    name = tool.operation.provider
                    raise InvalidSetting(
                        variable=url_variable(name),
                        value=providers.endpoints[name].base_url,
                        expected=f"settings tool {tool.name!r}'s client opens with; it raised "
                        f"{type(exc).__name__}: {exc}",
                    ) from None
        return providers

    @property
    def http(self) -> ProviderHttp:
        """The default provider's client (the sandbox's listing is read through it)."""
        return self._http[self.endpoints[DEFAULT_PROVIDER].base_url]

    def http_providers(self) -> dict[str, ProviderHttp]:
        """Each configured provider with a base URL, by name, and its client."""
        return {name: self._http[e.base_url] for name, e in self.endpoints.items() if e.base_url}

    async def close(self) -> None:
        """Close every provider's HTTP session."""
        for http in self._http.values():
            await http.close()

    async def __aenter__(self) -> Providers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _opened(self, tool: Tool, operation: PythonOperation) -> ProviderClient:
        """The tool's Python client, opened once with its provider's settings. KeyError: not configured here."""
        client = self._python.get(tool.name)
        if client is None:
            opened = operation.client(self.endpoints[operation.provider])
            client = self._python[tool.name] = legacy_clients.served(tool.name, opened)
        return client

    def _python_client(self, tool: Tool, operation: PythonOperation) -> ProviderClient | ProviderAnswer:
        """The client, or the unknown answer to give when it cannot be had (nothing was sent)."""
        if operation.provider not in self.endpoints:
            return ProviderAnswer(
                Answer.UNKNOWN,
                {},
                detail=f"{tool.name}: provider {operation.provider!r} is not configured here",
            )
        try:
            return self._opened(tool, operation)
        except Exception as exc:  # noqa: BLE001 -- the adopter's constructor
            return ProviderAnswer(
                Answer.UNKNOWN,
                {},
                detail=f"{tool.name}: its client did not open: {type(exc).__name__}: {exc}",
            )

    def _shown(self, provider: str, answer: ProviderAnswer) -> ProviderAnswer:
        """An HTTP provider's answer as it may be journaled: its credential masked (an error body that echoes the
        request's `Authorization`, a record that quotes it)."""
        mask = self._masks.get(provider)
        return mask.answer(answer) if mask is not None else answer

    def _headers(
        self, sent: Context, operation: HttpOperation, args: dict[str, Any] | None
    ) -> dict[str, str]:
        headers = headers_for(sent)
        # Asked in the account the write acted in: a provider keeps each account's keys apart, so asked in another
        # (or the default) a tenant's effect would read as never made.
        if account := (args or {}).get(ACCOUNT_ARG):
            headers[Header.PROVIDER_ACCOUNT.value] = str(account)
        endpoint = self.endpoints.get(operation.provider)
        if endpoint is not None and endpoint.credential:
            headers[Header.AUTHORIZATION.value] = f"Bearer {endpoint.credential}"
        return headers

    def _http_of(self, tool: Tool, operation: HttpOperation) -> ProviderHttp | ProviderAnswer:
        endpoint = self.endpoints.get(operation.provider)
        if endpoint is None or not endpoint.base_url:
            return ProviderAnswer(
                Answer.UNKNOWN,
                {},
                detail=f"{tool.name}: provider {operation.provider!r} has no base URL here",
            )
        return self._http[endpoint.base_url]

    async def call(
        self, tool: Tool, request: ActionRequest, timeout: float, *, ctx: Context | None = None
    ) -> ProviderAnswer:
        """Carry out the effect once, with the request's key; an answer we cannot trust is `unknown`. A provider's
        call is a `provider.call` span under `ctx` (else the task's current span), its context sent along."""
        match tool.operation:
            case LocalOperation(run=run):
                return ProviderAnswer(Answer.OK, await run(request.args, request.key), ref=request.key)
            case KvOperation() as kv_operation:
                if self.kv is None:
                    return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{tool.name}: no key-value access here")
                return await self.kv.call(kv_operation, request)
            case PythonOperation() as python:
                with span(
                    SpanName.PROVIDER_CALL,
                    ctx if ctx is not None else current(),
                    run_id=request.run_id,
                    step_no=request.step_no or None,
                    idempotency_key=request.key,
                    tool=tool.name,
                ) as sent:
                    client = self._python_client(tool, python)
                    if isinstance(client, ProviderAnswer):
                        answer = client
                    else:
                        # `deadline` is the step's timeout from now; the whole call gets the grace HTTP gets.
                        call = python_calls.question(request.args, request.key, timeout)
                        answer = await python_calls.asked(
                            f"{tool.name}'s call",
                            lambda: client.call(call),
                            python_calls.CALL_ANSWERS,
                            timeout * _WHOLE_CALL,
                            self.code_limit,
                        )
                    answer = python_calls.without(self._masks.get(python.provider), answer)
                    _noted(sent, answer)
                    return answer
            case HttpOperation() as operation:
                http_client = self._http_of(tool, operation)
                if isinstance(http_client, ProviderAnswer):
                    return http_client
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
                    headers = self._headers(sent, operation, request.args)
                    headers[Header.IDEMPOTENCY_KEY.value] = request.key
                    try:
                        # The client's timeout bounds each read, not the answer: one trickled a byte at a time
                        # would hold the call (and the worker's slot and claim) for ever. The whole call too.
                        async with asyncio.timeout(timeout * _WHOLE_CALL):
                            response = await http_client.request(
                                http.method,
                                http.path,
                                json_body=http.json,
                                params=http.params,
                                headers=headers,
                                timeout=timeout,
                            )
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        # Timeout or dropped connection after sending: the provider may or may not have done it.
                        answer = ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{type(exc).__name__}: {exc}")
                    else:
                        annotate(sent, **{SpanAttr.HTTP_STATUS: response.status_code})
                        answer = read_answer(response, operation)
                    answer = self._shown(operation.provider, answer)
                    _noted(sent, answer)
                    return answer
        raise AssertionError(f"unhandled operation {tool.operation!r}")

    async def listing(self, tool: Tool, timeout: float = 60.0) -> list[ProviderEffect] | str:
        """Every effect a Python operation's provider lists (`lists=True`), for the audit; or why there is none."""
        operation = tool.operation
        if not isinstance(operation, PythonOperation) or not operation.lists:
            return f"{tool.name} offers no listing"
        client = self._python_client(tool, operation)
        if isinstance(client, ProviderAnswer):
            return client.detail
        return await python_calls.listed(
            f"{tool.name}'s listing", cast(ListingClient, client), timeout, self.code_limit
        )

    def can_look_up(self, tool: Tool) -> bool:
        """A local effect leaves nothing to ask about: asking says `absent`, and calling again is the same as once."""
        match tool.operation:
            case LocalOperation() | KvOperation():
                return True
            case PythonOperation(looks_up=looks_up):
                return looks_up
            case HttpOperation(lookup_path=path):
                return path is not None
        raise AssertionError(f"unhandled operation {tool.operation!r}")

    def lookup_informative(self, tool: Tool) -> bool:
        """Whether the tool's lookup can say more than "absent": a local effect's cannot (it asks nobody), so an
        "absent" there with the attempts spent will never turn into "found" (`unknown_finality`)."""
        return not isinstance(tool.operation, LocalOperation)

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
            case PythonOperation(looks_up=False) | HttpOperation(lookup_path=None):
                return ProviderAnswer(Answer.UNKNOWN, {}, detail=f"{tool.name} has no lookup by key")
            case PythonOperation() as python:
                with span(
                    SpanName.PROVIDER_CALL,
                    ctx if ctx is not None else current(),
                    idempotency_key=key,
                    tool=tool.name,
                ) as asked:
                    client = self._python_client(tool, python)
                    if isinstance(client, ProviderAnswer):
                        answer = client
                    else:
                        asked_about = python_calls.question(args or {}, key, timeout)
                        answer = await python_calls.asked(
                            f"{tool.name}'s lookup",
                            lambda: client.lookup(asked_about),
                            python_calls.LOOKUP_ANSWERS,
                            timeout * _WHOLE_CALL,
                            self.code_limit,
                        )
                    answer = python_calls.without(self._masks.get(python.provider), answer)
                    _noted(asked, answer)
                    return answer
            case HttpOperation(lookup_path=str(path)) as operation:
                http_client = self._http_of(tool, operation)
                if isinstance(http_client, ProviderAnswer):
                    return http_client
                with span(
                    SpanName.PROVIDER_CALL,
                    ctx if ctx is not None else current(),
                    idempotency_key=key,
                    tool=tool.name,
                    **{SpanAttr.HTTP_METHOD: "GET", SpanAttr.HTTP_ROUTE: path},
                ) as asked:
                    headers = self._headers(asked, operation, args)
                    try:
                        async with asyncio.timeout(timeout * _WHOLE_CALL):
                            response = await http_client.get(
                                path.format(key=key), headers=headers, timeout=timeout
                            )
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        answer = ProviderAnswer(
                            Answer.UNKNOWN, {}, detail=f"lookup failed: {type(exc).__name__}: {exc}"
                        )
                    else:
                        annotate(asked, **{SpanAttr.HTTP_STATUS: response.status_code})
                        answer = read_lookup(response, operation)
                    answer = self._shown(operation.provider, answer)
                    _noted(asked, answer)
                    return answer
        raise AssertionError(f"unhandled operation {tool.operation!r}")
