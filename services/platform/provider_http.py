"""One outside provider's HTTP client (a tool's provider, a model's API): an aiohttp session with keep-alive
connections at its base URL, answers read whole."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import certifi
from aiohttp.helpers import get_env_proxy_for_url
from multidict import CIMultiDictProxy
from yarl import URL

# At most this many connections at once per base URL (aiohttp has no cap on idle ones). An idle connection is closed
# after 4 s, before the servers that close theirs at 5 s (uvicorn, Node) do: a request sent on a connection the
# server is closing meets a reset, an unknown outcome to ask about by key. At 5 s, as httpx's expiry was, the
# reference agent's bench met 1-5 such resets a run (the projector's email and CRM calls); at 4 s, none.
_CONNECTIONS = 200
_KEEPALIVE_S = 4.0
# A call with no timeout of its own (the sandbox's listing): httpx's default, per phase, as before.
_DEFAULT_TIMEOUT_S = 5.0


class ProviderStatusError(aiohttp.ClientError):
    """A provider answered with a status its reader cannot use (`ProviderResponse.raise_for_status`)."""


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A provider's HTTP answer, read whole: its status, its headers, its (decompressed) body."""

    status_code: int
    headers: CIMultiDictProxy[str]
    content: bytes

    def header(self, name: str) -> str | None:
        """A header's value, a repeated header's values joined by ", " (as httpx read them); None if absent."""
        values = self.headers.getall(name, ())
        return ", ".join(values) if values else None

    def raise_for_status(self) -> None:
        """Any answer but a 2xx is a `ProviderStatusError` (redirects are never followed)."""
        if not 200 <= self.status_code < 300:
            raise ProviderStatusError(f"provider answered {self.status_code}")


def _query(params: Mapping[str, Any] | None) -> list[tuple[str, str]] | None:
    """Query parameters as httpx wrote them: a list or tuple is the name repeated, true/false for a bool, None as
    empty, anything else as `str()` (aiohttp would refuse a bool or a None outright)."""
    if not params:
        return None
    return [
        (str(name), _query_value(item))
        for name, value in params.items()
        for item in (value if isinstance(value, (list, tuple)) else (value,))
    ]


def _query_value(value: Any) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    return "" if value is None else str(value)


def _json_body(body: Any) -> bytes:
    """A JSON body as httpx encoded it: compact, UTF-8, and NaN or infinity refused (a ValueError, before sending)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _tls_context() -> ssl.SSLContext:
    """The certificates httpx trusted: SSL_CERT_FILE or SSL_CERT_DIR where set (read by `ssl`, as OpenSSL reads
    them), else certifi's bundle."""
    paths = ssl.get_default_verify_paths()
    if paths.cafile and paths.cafile != paths.openssl_cafile:
        return ssl.create_default_context(cafile=paths.cafile)
    if paths.capath and paths.capath != paths.openssl_capath:
        return ssl.create_default_context(capath=paths.capath)
    return ssl.create_default_context(cafile=certifi.where())


class ProviderHttp:
    """The HTTP client of one provider base URL. The session opens on the first request (it needs the running loop);
    the proxy the environment names for the URL (HTTP(S)_PROXY, NO_PROXY) is read once, as httpx read it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        # httpx's joining: the base URL's path, then the request's path without its leading "/".
        self._prefix = base_url if base_url.endswith("/") else f"{base_url}/"
        self._tls: ssl.SSLContext | bool = _tls_context() if base_url.startswith("https:") else True
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None
        with contextlib.suppress(LookupError):  # none named, or NO_PROXY names the host
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(base_url))

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._closed:
                raise RuntimeError(f"the HTTP client of {self.base_url} is closed")
            connector = aiohttp.TCPConnector(
                limit=_CONNECTIONS, keepalive_timeout=_KEEPALIVE_S, ssl=self._tls
            )
            # No cookie jar: calls for every tenant share these connections, and a cookie one tenant's answer set
            # must never ride on another's call (its session at the provider, its account).
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = _DEFAULT_TIMEOUT_S,
    ) -> ProviderResponse:
        """Send one request and read its whole answer. `timeout` bounds getting a connection, connecting and each
        read, not the answer (the caller bounds the whole). Any failure is an `aiohttp.ClientError` or a
        `TimeoutError`; a body that cannot be encoded is a ValueError, raised before anything is sent. `content`:
        a body encoded already, sent as it is with the caller's headers (a JSON `json_body` sets its own type)."""
        data = content
        if json_body is not None:
            data = _json_body(json_body)
            headers = {**(headers or {}), "Content-Type": "application/json"}
        limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout, sock_read=timeout)
        async with self._opened().request(
            method,
            self._prefix + path.lstrip("/"),
            params=_query(params),
            data=data,
            headers=headers,
            timeout=limits,
            allow_redirects=False,
            proxy=self._proxy,
            proxy_auth=self._proxy_auth,
        ) as response:
            content = await response.read()
            return ProviderResponse(response.status, response.headers, content)

    async def get(
        self,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = _DEFAULT_TIMEOUT_S,
    ) -> ProviderResponse:
        """`request` with GET."""
        return await self.request("GET", path, params=params, headers=headers, timeout=timeout)

    async def close(self) -> None:
        """Close the session and its connections; a request after this is a RuntimeError, as httpx's was."""
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
