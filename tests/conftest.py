"""Shared fixtures: one real nats-server per test session, a unique namespace per test, whole stacks on demand.

Tests live in three folders, and each test is marked by its folder (`pytest -m unit`, `just test-unit`):

* `unit/`: pure; no nats-server, no processes, no network.
* `integration/`: the session's real nats-server, services built in this process (tests/support/inprocess.py).
* `e2e/`: whole stacks of real processes, processes killed, chaos.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsAuth, NatsServer
from crashsafe.services.platform.jetstream import Broker
from tests.support.inprocess import REGISTRY
from tests.support.nats_users import access, admit
from tests.support.stack import StackClient, open_stack

KINDS = ("unit", "integration", "e2e")
# Tool families only a test's own registry has (test_composition.py's `stamps`, tests/support/python_providers.py's `orders`).
TEST_ONLY_FAMILIES = frozenset({"stamps", "orders"})
# A unit test that asks for one of these is not a unit test.
NOT_PURE = {"nats_server", "broker", "start_stack"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts
        kind = parts[0] if len(parts) > 1 else None
        if kind not in KINDS:
            raise pytest.UsageError(
                f"{item.nodeid}: tests live in tests/unit, tests/integration or tests/e2e"
            )
        if kind == "unit" and NOT_PURE & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid}: a unit test may not use {sorted(NOT_PURE)}")
        item.add_marker(getattr(pytest.mark, kind))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A teardown cut short by the per-test timeout can leave an executor's SQLite store open, and aiosqlite's
    worker thread is no daemon: the interpreter then waited for it forever at exit (pytest "hung at exit" after
    a teardown timeout, docs/testing.md). Stop whatever is left, so the run ends and reports the timeout."""
    for thing in gc.get_objects():
        if isinstance(thing, aiosqlite.Connection):
            thing.stop()


MOST_PARTITIONS = 64


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """Users on, as in a deployment: one per role, for any namespace (each test has its own) and every tool
    family the tests' registries have (tests/integration/test_nats_permissions.py sweeps one namespace's), and as
    many partitions as the largest shape a test runs (tests/e2e/test_shapes.py: 64)."""
    root = tmp_path_factory.mktemp("nats")
    auth = NatsAuth.for_deployment(
        root / "auth", None, REGISTRY.families | TEST_ONLY_FAMILIES, partitions=MOST_PARTITIONS
    )
    server = NatsServer(root, auth=auth).start()
    admit(server)
    yield server
    server.stop()


@pytest.fixture
def namespace() -> Namespace:
    """Each test gets its own streams and subjects on the shared server."""
    return Namespace(f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def broker(nats_server: NatsServer) -> AsyncIterator[Broker]:
    """The test's own connection, as the operator: tests inject what no service may (tests/support/nats_users.py)."""
    b = await Broker.connect(nats_server.url, "tests", access=access(nats_server.url, Role.OPERATOR))
    yield b
    await b.close()


@pytest.fixture
async def start_stack(
    tmp_path: Path, nats_server: NatsServer, namespace: Namespace
) -> AsyncIterator[Callable[..., Awaitable[StackClient]]]:
    """Start whole stacks of real processes on the session's nats-server, in the test's namespace; each is
    stopped after the test. Keyword arguments go to `crashsafe.stack.Stack` (`crash=`, `executors=`, ...)."""
    async with AsyncExitStack() as stacks:
        count = 0

        async def start(**kwargs: Any) -> StackClient:
            nonlocal count
            count += 1
            kwargs.setdefault("nats_url", nats_server.url)
            kwargs.setdefault("namespace", namespace.name)
            return await stacks.enter_async_context(open_stack(tmp_path / f"stack{count}", **kwargs))

        yield start
