"""The audit's listing of what providers hold, from a Python operation that lists (`lists=True`): an effect no run
journaled is found, as it is at an HTTP provider with a ledger (issue 32, item 14)."""

from __future__ import annotations

import pytest

from bench.workloads import StepsAgent
from crashsafe.audit_command import listings
from crashsafe.contracts.audit import FindingKind, ProviderEffect
from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.domain.effect_audit import audit
from crashsafe.domain.registry import PythonOperation, Registration, Registry, Tool
from crashsafe.services.providers.provider_calls import Providers
from tests.support.python_providers import NOTE, OrderBook, OrderClient, order_tool

pytestmark = pytest.mark.unit


def providers() -> Providers:
    return Providers({DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER)})


def deployment(*tools: Tool) -> Registry:
    return Registry.of(Registration(agent=StepsAgent(steps=1), tools=tools))


async def test_an_effect_no_journal_asked_for_is_found_through_a_python_operations_listing() -> None:
    book = OrderBook()
    book.orders["run_gone:3"] = {
        "order_id": "ord_7"
    }  # made by a run whose journal is gone, or outside crashsafe
    registry = deployment(order_tool(book, DEFAULT_PROVIDER, lists=True))
    listing, notes = await listings(providers(), registry)
    assert listing is not None and notes == []
    effects = await listing.effects()
    assert effects == [ProviderEffect("order", "run_gone:3", "ord_7")]
    findings = audit({}, effects, {}, registry.tools)
    assert [(f.kind, f.key) for f in findings] == [(FindingKind.EFFECT_WITHOUT_INTENT, "run_gone:3")]


async def test_two_tools_listing_one_provider_count_each_effect_once() -> None:
    book = OrderBook()
    book.orders["run_1:1"] = {"order_id": "ord_1"}
    twin = Tool(
        NOTE,
        PythonOperation(lambda settings: OrderClient(book, settings), provider=DEFAULT_PROVIDER, lists=True),
    )
    registry = deployment(order_tool(book, DEFAULT_PROVIDER, lists=True), twin)
    listing, _ = await listings(providers(), registry)
    assert listing is not None and await listing.effects() == [ProviderEffect("order", "run_1:1", "ord_1")]


class Broken(OrderClient):
    async def effects(self) -> list[ProviderEffect]:
        raise ConnectionResetError("the list API dropped the connection")


async def test_a_listing_that_fails_leaves_the_audit_by_key_alone_and_says_why() -> None:
    book = OrderBook()
    broken = Tool(NOTE, PythonOperation(lambda s: Broken(book, s), provider=DEFAULT_PROVIDER, lists=True))
    listing, notes = await listings(providers(), deployment(order_tool(book, DEFAULT_PROVIDER), broken))
    assert listing is None
    assert notes == [
        "NOTE send_note: no listing (send_note's listing raised ConnectionResetError: the list API dropped the"
        " connection)",
        "NOTE place_order, send_note: Python operations that list no effects; each journaled effect is asked"
        " about by its key through the operation's own lookup",
    ]
