"""A provider's HTTP client writes requests as httpx wrote them (services/platform/provider_http.py): query
values, JSON bodies, repeated headers, and what `raise_for_status` refuses."""

from __future__ import annotations

import json
import math

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from crashsafe.services.platform.provider_http import (
    ProviderResponse,
    ProviderStatusError,
    _json_body,
    _query,
)


def answer(status: int, *headers: tuple[str, str]) -> ProviderResponse:
    return ProviderResponse(status, CIMultiDictProxy(CIMultiDict(headers)), b"{}")


def test_query_values_are_written_as_httpx_wrote_them() -> None:
    """A tool's arguments go out as its query (`search_hotels`): aiohttp alone would refuse a bool or a None."""
    params = {
        "city": "Lisbon",
        "guests": 2,
        "refundable": True,
        "pets": False,
        "note": None,
        "tags": ["a", "b"],
    }
    assert _query(params) == [
        ("city", "Lisbon"),
        ("guests", "2"),
        ("refundable", "true"),
        ("pets", "false"),
        ("note", ""),
        ("tags", "a"),
        ("tags", "b"),
    ]
    assert _query({}) is None and _query(None) is None


def test_a_json_body_is_compact_utf8_and_refuses_nan_before_sending() -> None:
    assert _json_body({"name": "Zoë", "n": [1, 2]}) == '{"name":"Zoë","n":[1,2]}'.encode()
    assert json.loads(_json_body({})) == {}
    with pytest.raises(ValueError):
        _json_body({"amount": math.nan})


def test_a_repeated_header_is_read_joined_and_an_absent_one_is_none() -> None:
    response = answer(429, ("Retry-After", "5"), ("retry-after", "6"), ("Idempotent-Replayed", "true"))
    assert response.header("retry-after") == "5, 6"
    assert response.header("IDEMPOTENT-REPLAYED") == "true"
    assert response.header("traceparent") is None


@pytest.mark.parametrize("status", [101, 302, 404, 503])
def test_only_a_2xx_passes_raise_for_status(status: int) -> None:
    answer(204).raise_for_status()
    with pytest.raises(ProviderStatusError) as raised:
        answer(status).raise_for_status()
    assert isinstance(raised.value, aiohttp.ClientError), "a listing's reader catches aiohttp's errors"
