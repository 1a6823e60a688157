"""The configuration catalog in JetStream KV: validated before it is published, refused at reload when invalid
(the last working revision stays in force, and says so), each run pinned to the revision it started with, and a
revision the bucket's history lost is a typed error, never another revision."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.catalog import Catalog, catalog_encoder
from crashsafe.contracts.errors import CatalogRevisionGone, InvalidCatalog
from crashsafe.contracts.policy import ApprovalAbove
from crashsafe.contracts.run_events import HandOffReason, RunHandedOff, RunNudged, RunResumed
from crashsafe.contracts.streams import CATALOG_HISTORY, catalog_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.handoff import handoff_reply
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_catalog import RunCatalog, publish_catalog, stored_catalog
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters
from tests.support.inprocess import REGISTRY
from tests.support.runs import started
from tests.support.waiting import eventually, unique

BOOKING = REGISTRY.agent("booking").config


def _catalog(label: str, max_steps: int = 20, **changes: object) -> Catalog:
    budget = msgspec.structs.replace(BOOKING.budget, max_steps=max_steps)
    return Catalog(
        agents={"booking": msgspec.structs.replace(BOOKING, budget=budget, **changes)}, label=label
    )


@pytest.fixture
async def runtime(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> AsyncIterator[Runtime]:
    """A runtime reading the namespace's catalog; it asks no model (the runs here are only started)."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data")
    async with inprocess.runtime(settings, catalog=True) as worker:
        yield worker


async def test_an_invalid_catalog_is_refused_at_publish_and_nothing_is_written(
    runtime: Runtime, broker: Broker, namespace: Namespace
) -> None:
    bad = _catalog(
        "bad",
        max_steps=0,
        tools=["search_hotels", "transfer_money"],
        rules=[ApprovalAbove(tool="wire_funds", limit_cents=-1)],
    )
    with pytest.raises(InvalidCatalog) as raised:
        await publish_catalog(broker, namespace, REGISTRY, bad)
    problems = " | ".join(raised.value.problems)
    assert "transfer_money" in problems and "wire_funds" in problems and "max_steps" in problems
    assert "limit_cents" in problems
    assert await broker.kv_get(catalog_spec(namespace), namespace.catalog_key) is None
    assert runtime.catalog.revision == 0


async def test_an_invalid_revision_is_refused_at_reload_and_the_last_working_one_stays(
    runtime: Runtime, broker: Broker, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer that skipped validation (an old CLI, a hand-made `nats kv put`) cannot break the runtime."""
    good = await publish_catalog(broker, namespace, REGISTRY, _catalog("good", max_steps=17))
    await eventually(lambda: runtime.catalog.revision == good, what="the good revision loaded")
    spec = catalog_spec(namespace)
    caplog.set_level(logging.WARNING)
    garbage = await broker.kv_write(spec, namespace.catalog_key, b"{not json", revision=None)
    unknown_tool = await broker.kv_write(
        spec,
        namespace.catalog_key,
        catalog_encoder.encode(_catalog("sneaky", tools=["refund_everything"])),
        revision=None,
    )
    await eventually(
        lambda: {garbage, unknown_tool} <= runtime.catalog.refused, what="both bad revisions refused"
    )
    assert runtime.catalog.revision == good
    refusals = [r for r in caplog.records if "catalog revision refused" in r.getMessage()]
    assert {r.__dict__["fields"]["revision"] for r in refusals} >= {garbage, unknown_tool}
    assert all(r.levelno == logging.WARNING for r in refusals)

    # A run started now is pinned to the last working revision, with its budget.
    revision, config = runtime.catalog.current("booking")
    assert revision == good and config.budget.max_steps == 17

    # A runtime starting now (the newest revision still the bad one) also takes the last good one.
    async with _fresh_catalog(runtime, namespace) as fresh:
        assert fresh.revision == good
        assert {garbage, unknown_tool} <= fresh.refused
        with pytest.raises(InvalidCatalog):
            await fresh.pinned(unknown_tool, "booking")


async def test_a_pinned_revision_is_read_by_number_after_newer_ones(
    runtime: Runtime, broker: Broker, namespace: Namespace
) -> None:
    first = await publish_catalog(broker, namespace, REGISTRY, _catalog("one", max_steps=11))
    for n in range(3):
        await publish_catalog(broker, namespace, REGISTRY, _catalog(f"later-{n}", max_steps=12 + n))
    async with _fresh_catalog(runtime, namespace) as fresh:
        assert (await fresh.pinned(first, "booking")).budget.max_steps == 11
        assert fresh.current("booking")[1].budget.max_steps == 14
        assert (await fresh.pinned(0, "booking")) == BOOKING  # revision 0: the built-in
    revision, shown = await stored_catalog(broker, namespace, REGISTRY, first)
    assert (revision, shown.label) == (first, "one")


async def test_a_revision_older_than_the_buckets_history_is_a_typed_error(
    runtime: Runtime, broker: Broker, namespace: Namespace
) -> None:
    """History 64: a run pinned to a revision published 64 publishes ago meets CatalogRevisionGone on a runtime
    that does not have it in memory (a restart, another replica), never a silent newer revision."""
    oldest = await publish_catalog(broker, namespace, REGISTRY, _catalog("oldest", max_steps=5))
    for n in range(CATALOG_HISTORY):
        await publish_catalog(broker, namespace, REGISTRY, _catalog(f"n{n}", max_steps=6))
    async with _fresh_catalog(runtime, namespace) as fresh:
        with pytest.raises(CatalogRevisionGone) as raised:
            await fresh.pinned(oldest, "booking")
        assert raised.value.revision == oldest
        with pytest.raises(CatalogRevisionGone):
            await fresh.pinned(oldest + 10_000, "booking")


@asynccontextmanager
async def _fresh_catalog(runtime: Runtime, namespace: Namespace) -> AsyncIterator[RunCatalog]:
    """The catalog as another replica, or this one after a restart, reads it: nothing in memory yet."""
    catalog = RunCatalog(REGISTRY, runtime.broker, namespace)
    await catalog.start()
    yield catalog


async def test_a_run_pinned_to_a_lost_revision_is_handed_off_not_run_under_another(
    runtime: Runtime, broker: Broker, namespace: Namespace
) -> None:
    """The runtime meets the run (a wake) and cannot find its revision: it never asks the model or decides under
    another revision's rules, and never leaves the run (and its session's lane) wedged on a dead letter: the run
    is handed to a person with reason `catalog_revision_gone` and a defined reply."""
    await publish_catalog(broker, namespace, REGISTRY, _catalog("current"))
    lost = msgspec.structs.replace(started(), run_id=f"run_{unique('lost')}", catalog_revision=999_999)
    journal = RunJournal(broker, namespace)
    await journal.append(lost, 0)
    await runtime.start()
    await wake_run(broker, runtime.settings, lost.run_id, "test", "test")

    async def ended() -> list[Any] | None:
        events, _ = await journal.read(lost.run_id)
        return events if any(isinstance(e, RunHandedOff) for e in events) else None

    events = await eventually(ended, what="the run handed off", timeout_s=30)
    (handed,) = [e for e in events if isinstance(e, RunHandedOff)]
    assert handed.reason == HandOffReason.CATALOG_REVISION_GONE and "999999" in handed.detail
    assert handed.reply == handoff_reply(HandOffReason.CATALOG_REVISION_GONE)
    # The wake picked the run up cold, so its worker journals where it resumed (a marker, not a decision).
    assert [type(e) for e in events[1:]] == [
        RunNudged,
        RunResumed,
        RunHandedOff,
    ]  # no model call, no decision
    assert await dead_letters(broker, namespace) == []
