"""Waiting for something to become true, and names no other test uses."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def eventually(
    check: Callable[[], Awaitable[T] | T], *, what: str, timeout_s: float = 60.0, every_s: float = 0.1
) -> T:
    """Poll `check` (sync or async) until it returns something truthy, and return that value.

    The machine is shared and slow, so the deadline is generous; a failing test names `what` it waited for.
    """

    async def ask() -> T:
        value = check()
        return await value if inspect.isawaitable(value) else value  # type: ignore[return-value]

    deadline = time.monotonic() + timeout_s
    last = await ask()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout_s:.0f}s (last: {last!r})")
        await asyncio.sleep(every_s)
        last = await ask()
    return last
