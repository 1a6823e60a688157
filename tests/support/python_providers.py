"""A provider written in Python the way an adopter writes one around its SDK: an in-memory order book keyed by
the idempotency key, with the faults a test arms (commit the write, then raise), and a registry that names it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bench.workloads import StepsAgent
from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.provider_settings import ProviderSettings
from crashsafe.contracts.tool_messages import Answer
from crashsafe.contracts.tools import Effect, RetryRule, ToolContract
from crashsafe.domain.registry import (
    HttpOperation,
    HttpRequest,
    ProviderAnswer,
    ProviderCall,
    PythonOperation,
    Registration,
    Registry,
    Tool,
)

ORDER = ToolContract(
    name="place_order",
    family="orders",
    effect=Effect.WRITE,
    timeout_s=2.0,
    retry=RetryRule.KEYED,
    max_attempts=3,
    in_flight_s=0.5,
)
NOTE = ToolContract(
    name="send_note", family="orders", effect=Effect.WRITE, timeout_s=2.0, retry=RetryRule.KEYED
)


@dataclass
class OrderBook:
    """The provider's side: what it holds per key, every call it was asked, and the faults armed for the next."""

    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)
    # The next N calls commit their order, then raise (the answer is lost after the write).
    raise_after_commit: int = 0
    # The next N calls raise before writing anything.
    raise_before_commit: int = 0
    # What each client was opened with (name, base URL, credential), in order.
    opened: list[tuple[str, str, str | None]] = field(default_factory=list)
    # The `deadline` each call got, with time.monotonic() when it came in.
    deadlines: list[tuple[float, float]] = field(default_factory=list)
    # Every question as the client was given it, calls and lookups alike.
    asked: list[ProviderCall] = field(default_factory=list)


class OrderClient:
    """A ProviderClient: places an order once per key; says what became of a key; lists every order it holds."""

    def __init__(self, book: OrderBook, settings: ProviderSettings) -> None:
        self.book = book
        book.opened.append((settings.name, settings.base_url, settings.credential))

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        key, args = call.key, call.args
        self.book.asked.append(call)
        self.book.calls.append(key)
        self.book.deadlines.append((call.deadline, time.monotonic()))
        if self.book.raise_before_commit:
            self.book.raise_before_commit -= 1
            raise ConnectionRefusedError("the provider's SDK could not connect")
        if (order := self.book.orders.get(key)) is not None:
            return ProviderAnswer(Answer.OK, order, ref=order["order_id"], replayed=True)
        if args.get("quantity", 1) <= 0:
            return ProviderAnswer(
                Answer.REJECTED, {"code": "invalid_quantity", "message": "quantity must be > 0"}
            )
        order = {"order_id": f"ord_{len(self.book.orders) + 1}", "item": args.get("item", ""), "key": key}
        self.book.orders[key] = order
        if self.book.raise_after_commit:
            self.book.raise_after_commit -= 1
            raise ConnectionResetError("connection reset after the provider committed")
        return ProviderAnswer(Answer.OK, order, ref=order["order_id"])

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        self.book.asked.append(call)
        self.book.lookups.append(call.key)
        if (order := self.book.orders.get(call.key)) is not None:
            return ProviderAnswer(Answer.FOUND, order, ref=order["order_id"])
        return ProviderAnswer(Answer.ABSENT, {})

    async def effects(self) -> list[ProviderEffect]:
        return [ProviderEffect("order", key, order["order_id"]) for key, order in self.book.orders.items()]


def order_tool(book: OrderBook, provider: str = "shop", lists: bool = False) -> Tool:
    client = PythonOperation(lambda settings: OrderClient(book, settings), provider=provider, lists=lists)
    return Tool(ORDER, client)


def registry(book: OrderBook | None = None, provider: str = "shop", lists: bool = False) -> Registry:
    """An agent of the benchmark's with a Python operation at `provider` and an HTTP one at `crm`: an executor
    of family `orders` needs both providers configured before it starts."""
    note = Tool(
        NOTE,
        HttpOperation(
            request=lambda args: HttpRequest("POST", "/notes", json=args),
            lookup_path=None,
            ref_field=None,
            provider="crm",
        ),
    )
    tools = (order_tool(book or OrderBook(), provider, lists), note)
    return Registry.of(Registration(agent=StepsAgent(steps=1), tools=tools))
