"""The readiness verdict (pure), and the metric vocabulary: every spec registered once, under a valid name."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from crashsafe.contracts import metric_names as spec
from crashsafe.contracts.metric_names import ALL_METRICS, MetricKind
from crashsafe.services.platform import metrics
from crashsafe.services.platform.probes import OK, Readiness, run_checks, verdict

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def test_every_check_ok_is_ready() -> None:
    got = verdict({"nats": None, "stream:RUNS": None})
    assert got == Readiness(ready=True, checks={"nats": OK, "stream:RUNS": OK})
    assert got.body() == {"ready": True, "missing": [], "checks": {"nats": OK, "stream:RUNS": OK}}


def test_one_failed_check_is_not_ready_and_keeps_its_reason() -> None:
    got = verdict({"nats": None, "consumer:runtime_inbound": "consumer runtime_inbound does not exist"})
    assert not got.ready
    assert got.failed == ["consumer:runtime_inbound"]
    assert got.missing == ["runtime_inbound"]  # the name the gateway's `missing` always used
    assert got.checks["consumer:runtime_inbound"] == "consumer runtime_inbound does not exist"


def test_nothing_to_check_is_not_ready_and_a_blank_reason_still_fails() -> None:
    assert verdict({}).ready is False
    got = verdict({"store:0": "  "})
    assert got.checks == {"store:0": "failed"} and not got.ready


async def test_a_raising_or_hanging_check_fails_by_name_and_sets_the_ready_gauge() -> None:
    async def fine() -> str | None:
        return None

    async def broken() -> str | None:
        raise ValueError("no active connection")

    async def hangs() -> str | None:
        import asyncio

        await asyncio.Event().wait()
        return None

    got = await run_checks({"nats": fine, "t_store": broken, "t_hang": hangs, "t_fine": fine}, timeout_s=0.05)
    assert not got.ready
    assert got.checks["t_store"] == "ValueError: no active connection"
    assert got.checks["t_hang"] == "no answer within 0.05s"
    assert got.checks["t_fine"] == OK
    assert metrics.READY.labels("t_store")._value.get() == 0
    assert metrics.READY.labels("t_fine")._value.get() == 1


async def test_without_nats_nothing_else_is_asked() -> None:
    asked: list[str] = []

    async def down() -> str | None:
        return "not connected to NATS (reconnecting)"

    async def stream() -> str | None:
        asked.append("stream")
        return None

    got = await run_checks({"nats": down, "stream:X": stream})
    assert got.body() == {
        "ready": False,
        "missing": ["nats"],
        "checks": {"nats": "not connected to NATS (reconnecting)"},
    }
    assert asked == []


def test_every_spec_is_registered_once_with_a_valid_name_and_labels() -> None:
    names = [m.name for m in ALL_METRICS]
    assert len(names) == len(set(names))
    for m in ALL_METRICS:
        assert _NAME.match(m.name) and m.name.startswith("crashsafe_"), m.name
        assert not m.name.endswith("_total"), f"{m.name}: prometheus-client adds _total to a counter"
        assert all(_LABEL.match(label) and not label.startswith("__") for label in m.labels), m
        assert len(set(m.labels)) == len(m.labels), m
        assert (m.kind is MetricKind.HISTOGRAM) == bool(m.buckets), m
        assert list(m.buckets) == sorted(m.buckets), m
        assert m.help and m.services, m
    # Each spec in contracts is in ALL_METRICS, and has its one object in the process's registry.
    declared = {v.name for v in vars(spec).values() if isinstance(v, spec.MetricSpec)}
    assert declared == set(names)
    # By the registry's names, not a scrape: an unlabelled gauge has no sample until its process sets it.
    registered = {name for name in metrics.REGISTRY._names_to_collectors}
    assert set(names) <= registered


def test_the_exposition_parses_and_a_child_is_made_once() -> None:
    children = metrics.Children(metrics.PROVIDER_CALLS)
    assert children("t_tool", "succeeded") is children("t_tool", "succeeded")
    before = children("t_tool", "succeeded")._value.get()
    children("t_tool", "succeeded").inc()
    parsed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }
    key = ("crashsafe_provider_calls_total", (("outcome", "succeeded"), ("tool", "t_tool")))
    assert parsed[key] == before + 1


def _ready_gauges() -> dict[str, float]:
    return {
        s.labels["check"]: s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
        if s.name == "crashsafe_ready"
    }


async def test_a_check_no_longer_asked_leaves_no_ready_gauge_behind() -> None:
    """A pod probed while starting (`started`), or an executor that handed a partition on (`store:2`), must not
    show crashsafe_ready 0 for a check it no longer has: an alert on `crashsafe_ready == 0` would page forever."""

    async def fine() -> str | None:
        return None

    async def starting() -> str | None:
        return "starting: not yet connected and subscribed"

    assert not (await run_checks({"t_started": starting})).ready
    assert _ready_gauges()["t_started"] == 0
    assert (await run_checks({"nats": fine, "t_store:2": fine})).ready
    assert (await run_checks({"nats": fine})).ready
    gauges = _ready_gauges()
    assert "t_started" not in gauges
    assert "t_store:2" not in gauges
    assert gauges["nats"] == 1
