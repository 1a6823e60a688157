"""Degraded modes where a whole stack is not the point, on the real nats-server with an in-process runtime
(docs/failure-modes.md, "Degraded modes"): each test names the answer (what the guest gets), the state (what the
journal says) and the event (what is published), and the metric an operator alerts on.

- every model provider down: both routes of the run's catalog fail (connections refused), each call is
  journaled as failed naming both, the run is handed off (`model_unavailable`) after MAX_FAILED_ASKS in a row,
  a support ticket is published, `crashsafe_model_failovers{route}` counts each route given up on;
- a catalog reload failed: `crashsafe_catalog_reload_failures` counts each refused revision,
  `crashsafe_catalog_revision` stays at the last working one, and the warning names the refused revision;
- policy documents missing: a policy question is handed off (`policy_unavailable`) before any model call, with
  its ticket; a booking request in the same runtime goes on to the model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.catalog import Catalog, ModelRoute, catalog_encoder
from crashsafe.contracts.run_events import (
    HandOffReason,
    JournalEvent,
    ModelAnswered,
    ModelAsked,
    PolicyDenied,
    RunHandedOff,
    RunStarted,
    ToolCall,
)
from crashsafe.contracts.streams import catalog_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.support import support_decoder
from crashsafe.domain.agent import Agent
from crashsafe.domain.fold import replay
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.model_calls import MAX_FAILED_ASKS, ModelReply
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_catalog import publish_catalog
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.model import ModelGateway
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.inprocess import REGISTRY
from tests.support.waiting import eventually, unique

BOOKING = REGISTRY.agent("booking").config


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def _ended(journal: RunJournal, run_id: str) -> list[JournalEvent]:
    async def ended() -> list[JournalEvent] | None:
        events, _ = await journal.read(run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    return await eventually(ended, what=f"run {run_id} to end", timeout_s=60)


async def _ticket_reason(broker: Broker, ns: Namespace, run_id: str) -> str:
    async def published() -> str | None:
        stored = await broker.read_subject(ns.stream(StreamKind.SUPPORT), ns.support("", run_id))
        return support_decoder.decode(stored[0].data).reason if stored else None

    return await eventually(published, what=f"the support ticket of {run_id}")


@pytest.fixture
def settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Any:
    return inprocess.settings_for(
        nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="degraded"
    )


async def test_every_model_route_down_fails_over_then_hands_off_with_a_defined_reason(
    settings: Any, broker: Broker, namespace: Namespace
) -> None:
    # Two providers, both refusing connections (ports nobody listens on), for the booking agent's runs.
    down = [
        ModelRoute(name=name, model="m", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=2.0)
        for name in ("primary", "secondary")
    ]
    before = {r.name: _sample("crashsafe_model_failovers_total", {"route": r.name}) for r in down}
    model = ModelGateway(None, None, "m", keys=lambda variable: "test-key")
    try:
        async with inprocess.runtime(settings, model, catalog=True) as worker:
            await publish_catalog(
                broker,
                namespace,
                REGISTRY,
                Catalog(
                    agents={"booking": msgspec.structs.replace(BOOKING, routes=down)}, label="all routes down"
                ),
            )
            await eventually(lambda: worker.catalog.revision > 0, what="the catalog loaded")
            await worker.start()
            run_id = await submit_inbound(broker, namespace, unique("ev"), agent="booking", text="hello")
            events = await _ended(RunJournal(broker, namespace), run_id)
    finally:
        await model.close()

    # The answer: the defined hand-off reply. The state: handed off, every failed call journaled with both routes.
    (handed,) = [e for e in events if isinstance(e, RunHandedOff)]
    assert handed.reason == HandOffReason.MODEL_UNAVAILABLE
    assert handed.reply == handoff_reply(HandOffReason.MODEL_UNAVAILABLE)
    failed = [e for e in events if isinstance(e, ModelAsked) and e.failed]
    assert len(failed) == MAX_FAILED_ASKS
    assert all(
        "primary: connection failed" in e.failed and "secondary: connection failed" in e.failed
        for e in failed
    )
    assert not [e for e in events if isinstance(e, ModelAnswered)]
    # The event: a ticket for a person, with the reason; nothing dead-lettered.
    assert await _ticket_reason(broker, namespace, run_id) == HandOffReason.MODEL_UNAVAILABLE
    assert await dead_letters(broker, namespace) == []
    # The metric: each route given up on, on every call.
    for route in down:
        after = _sample("crashsafe_model_failovers_total", {"route": route.name})
        assert after - before[route.name] == MAX_FAILED_ASKS


async def test_a_failed_catalog_reload_is_counted_and_the_revision_in_force_stays(
    settings: Any, broker: Broker, namespace: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    async with inprocess.runtime(settings, catalog=True) as worker:
        good = await publish_catalog(
            broker, namespace, REGISTRY, Catalog(agents={"booking": BOOKING}, label="good")
        )
        await eventually(lambda: worker.catalog.revision == good, what="the good revision loaded")
        assert _sample("crashsafe_catalog_revision") == good
        failures = _sample("crashsafe_catalog_reload_failures_total")
        caplog.set_level(logging.WARNING)
        # A writer that skipped validation: not JSON at all, then a catalog naming a tool nobody has.
        spec = catalog_spec(namespace)
        garbage = await broker.kv_write(spec, namespace.catalog_key, b"{not json", revision=None)
        sneaky = msgspec.structs.replace(BOOKING, tools=["wire_everything"])
        unknown = await broker.kv_write(
            spec,
            namespace.catalog_key,
            catalog_encoder.encode(Catalog(agents={"booking": sneaky})),
            revision=None,
        )
        await eventually(lambda: {garbage, unknown} <= worker.catalog.refused, what="both revisions refused")

        assert _sample("crashsafe_catalog_reload_failures_total") == failures + 2
        assert _sample("crashsafe_catalog_revision") == good == worker.catalog.current("booking")[0]
        refusals = [r for r in caplog.records if "catalog revision refused" in r.getMessage()]
        named = {r.__dict__["fields"]["revision"] for r in refusals}
        kept = {r.__dict__["fields"]["kept_revision"] for r in refusals}
        assert named >= {garbage, unknown} and kept == {good}


class _AnswersOnce:
    """The outside world's model: says one thing and records that it was asked (the documents' mode decides
    whether it is asked at all)."""

    def __init__(self) -> None:
        self.asked = 0

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        self.asked += 1
        calls: tuple[ToolCall, ...] = ()
        return ModelReply(
            model="m",
            response_id=f"r{self.asked}",
            tool_calls=calls,
            reply="Which dates?",
            input_tokens=1,
            output_tokens=1,
        )


async def test_without_policy_documents_a_policy_question_is_handed_off_and_a_request_is_answered(
    settings: Any, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    library = Library.stayhub(tmp_path / "empty")
    assert not library.available
    model = _AnswersOnce()
    journal = RunJournal(broker, namespace)
    async with inprocess.runtime(settings, model, library=library) as worker:
        assert _sample("crashsafe_knowledge_available") == 0.0  # the alert: documents missing, still serving
        await worker.start()
        question = await submit_inbound(
            broker, namespace, unique("ev"), agent="booking", text="What is the cancellation policy?"
        )
        asked = await _ended(journal, question)
        request = await submit_inbound(
            broker, namespace, unique("ev"), agent="booking", text="Can you book me a room in Lisbon?"
        )
        answered = await _ended(journal, request)

    # The question: handed off before any model call, with the defined reply and the documents' problem.
    assert [type(e) for e in asked] == [RunStarted, RunHandedOff]
    handed = asked[-1]
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.POLICY_UNAVAILABLE
    assert handed.reply == handoff_reply(HandOffReason.POLICY_UNAVAILABLE)
    assert library.problem in handed.detail
    assert await _ticket_reason(broker, namespace, question) == HandOffReason.POLICY_UNAVAILABLE
    # The request: the model answered it (no passages: there are none), the run completed.
    assert model.asked == 1
    state = replay(answered)
    assert state is not None and state.status == "completed" and state.final_reply == "Which dates?"


class _AsksALongStay(_AnswersOnce):
    """A model that asks for a 360-night search first (a rule forbids it), then answers in text."""

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        self.asked += 1
        if self.asked > 1:
            return await super().answer(agent, items, config, deadline_at)
        stay = '{"city": "Lisbon", "check_in": "2031-01-10", "check_out": "2032-01-05"}'
        calls = (ToolCall(call_id="call_long", name="search_hotels", arguments=stay),)
        return ModelReply(
            model="m", response_id="r1", tool_calls=calls, reply=None, input_tokens=1, output_tokens=1
        )


async def test_a_policy_denial_is_journaled_and_counted_by_rule(
    settings: Any, broker: Broker, namespace: Namespace
) -> None:
    """Not a degraded mode, but the metric beside it: `crashsafe_policy_denials_total{rule}` per denial journaled."""
    model = _AsksALongStay()
    async with inprocess.runtime(settings, model) as worker:
        await worker.start()
        before = _by_label("crashsafe_policy_denials_total", "rule")
        run_id = await submit_inbound(broker, namespace, unique("ev"), agent="booking", text="a long stay")
        events = await _ended(RunJournal(broker, namespace), run_id)
    (denied,) = [e for e in events if isinstance(e, PolicyDenied)]
    assert denied.tool == "search_hotels" and denied.rule
    after = _by_label("crashsafe_policy_denials_total", "rule")
    assert after.get(denied.rule, 0.0) == before.get(denied.rule, 0.0) + 1
    assert sum(after.values()) == sum(before.values()) + 1


def _by_label(name: str, label: str) -> dict[str, float]:
    return {
        sample.labels[label]: sample.value
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
        if sample.name == name
    }
