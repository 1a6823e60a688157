"""The gateway's door: every request's key, scope and rates checked, its body read within the limit, and a refusal answered as a typed error."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from litestar import Request, Response

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import BodyTooLarge, CrashsafeError, RateLimited, Unauthenticated
from crashsafe.contracts.headers import Header
from crashsafe.contracts.inbound import MAX_BODY_BYTES
from crashsafe.domain.access import Client, authenticate, parse_bearer, require
from crashsafe.domain.admission import status_for, too_large
from crashsafe.domain.token_buckets import Rate, TokenBuckets
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.client_keys import ClientKeys

logger = logging.getLogger("crashsafe.gateway")  # the gateway's one logger, whatever the module


def error_response(exc: CrashsafeError) -> Response[Any]:
    body = {"error": {"code": exc.code.value, "message": exc.message, "details": exc.details()}}
    headers = (
        {Header.RETRY_AFTER.value: str(max(1, math.ceil(exc.retry_after_s)))}
        if isinstance(exc, RateLimited)
        else None
    )
    return Response(content=body, status_code=status_for(exc), headers=headers)


class Door:
    """What every request passes: its key checked against the stored record, its scope, and the rates."""

    def __init__(self, keys: ClientKeys, settings: Settings) -> None:
        self.keys = keys
        self.clients = TokenBuckets(Rate.of(settings.rate_per_client))
        self.guests = TokenBuckets(Rate.of(settings.rate_per_guest))
        per_run = settings.reconcile_per_minute / 60
        self.reconciles = TokenBuckets(Rate(per_run, max(settings.reconcile_per_minute / 2, 1.0)))

    async def client(self, request: Request[Any, Any, Any], scope: Scope) -> Client:
        try:
            key_id, secret = parse_bearer(request.headers.get(Header.AUTHORIZATION))
            # A direct get on every request: a revocation reaches every replica with its next request.
            client = authenticate(key_id, secret, await self.keys.get(key_id))
        except Unauthenticated as exc:
            log(logger, logging.INFO, "refused", reason=exc.reason, path=request.url.path)
            raise
        require(client, scope)
        self.limit(self.clients, client.key_id, "client")
        return client

    @staticmethod
    def limit(buckets: TokenBuckets, key: str, limit: str) -> None:
        wait = buckets.take(key, time.monotonic())
        if wait:
            raise RateLimited(limit=limit, retry_after_s=wait)


async def read_body(request: Request[Any, Any, Any]) -> bytes:
    """The body, refused before it is read if its announced length is too large, and as soon as more than the
    limit has arrived if it is sent without one (chunked): a 10 MB body is never taken in."""
    refused = too_large(request.headers.get(Header.CONTENT_LENGTH))
    if refused is not None:
        raise refused
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size=size, limit=MAX_BODY_BYTES)
        chunks.append(chunk)
    return b"".join(chunks)
