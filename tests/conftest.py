"""Shared fixtures: one real nats-server per test session, a unique namespace per test, whole stacks on demand."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from services.platform.natsd import NatsServer
from crashsafe.stack import Stack


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> Namespace:
    """Each test gets its own streams and subjects on the shared server."""
    return Namespace(f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def broker(nats_server: NatsServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url, "tests")
    yield b
    await b.close()


@pytest.fixture
def make_stack(
    tmp_path: Path, nats_server: NatsServer, namespace: Namespace
) -> Iterator[Callable[..., Stack]]:
    """Start the whole stack as real processes on the session's nats-server; stopped after the test."""
    stacks: list[Stack] = []

    def make(**kwargs: Any) -> Stack:
        kwargs.setdefault("nats_url", nats_server.url)
        kwargs.setdefault("namespace", namespace.name)
        stack = Stack(tmp_path / f"stack{len(stacks)}", **kwargs)
        stacks.append(stack)
        return stack.start()

    yield make
    for stack in stacks:
        stack.stop()
