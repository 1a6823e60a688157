"""How a provider's HTTP answers are read: only its typed refusal is a refusal, only its typed "no such key" is
absent, and every other answer (5xx, 408, 429, a key in use, a body that is not the provider's) is unknown."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from crashsafe.contracts.headers import Header
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain.registry import HttpOperation, ProviderAnswer
from crashsafe.services.platform.provider_http import ProviderResponse

# Statuses that say "not now" about the request, not "no" to it: the provider may or may not have acted.
_NOT_NOW = frozenset({408, 425, 429})
_MAX_RETRY_AFTER_S = 60.0


def _json(response: ProviderResponse) -> dict[str, Any] | None:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def provider_error(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """The provider's own typed error (`{"error": {"code": "...", ...}}`); None for any other shape, which a
    proxy, a load balancer or a framework in front of it may have written."""
    error = body.get("error") if body is not None else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and error["code"]:
        return error
    return None


def retry_after_s(response: ProviderResponse) -> float | None:
    """The Retry-After header in seconds (delta-seconds or an HTTP date), bounded; None if absent or unreadable."""
    value = response.header("retry-after")
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


def _unknown(response: ProviderResponse, why: str) -> ProviderAnswer:
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


def read_answer(response: ProviderResponse, operation: HttpOperation) -> ProviderAnswer:
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
        if (response.header(Header.IDEMPOTENT_REPLAYED.value) or "").lower() == "true":
            return dataclasses.replace(answer, replayed=True)
        return answer
    error = provider_error(body)
    if status < 400 or error is None:
        return _unknown(response, " with a body that is not the provider's")
    if error["code"] in operation.in_use_codes:
        return _unknown(response, f" {error['code']}: an earlier request with this key is still in progress")
    return ProviderAnswer(Answer.REJECTED, error, detail=f"provider answered {status}")


def read_lookup(response: ProviderResponse, operation: HttpOperation) -> ProviderAnswer:
    """What a provider's answer to "what became of key K?" means. Absent only from its typed "no such key";
    a bare 404 (a wrong route, a gateway), an expired key or anything else unreadable is unknown."""
    status = response.status_code
    body = _json(response)
    error = provider_error(body)
    if status == 404 and error is not None and error["code"] in operation.absent_codes:
        return ProviderAnswer(Answer.ABSENT, {}, detail=f"provider: {error['code']}")
    if 200 <= status < 300 and body is not None:
        return _by_status(operation, body, Answer.FOUND)
    if error is not None:
        return _unknown(response, f" {error['code']}")
    return _unknown(
        response, " with a body that is not the provider's" if body is None or status < 500 else ""
    )
