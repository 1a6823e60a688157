"""The subjects each service proves at readiness are ones this release's streams take, each by the stream named
and by no other: a sample no declared stream takes would keep a service unready on a broker provisioned right."""

from __future__ import annotations

import pytest

from crashsafe.contracts.stream_routes import (
    Route,
    executor_routes,
    gateway_routes,
    matches,
    projector_routes,
    reconciler_routes,
    runtime_routes,
)
from crashsafe.contracts.streams import stream_specs
from crashsafe.contracts.subjects import EventClass, Namespace

NS = Namespace("routes")
FAMILIES = ("booking", "payment")


def test_the_matcher_is_nats_own() -> None:
    assert matches("a.*.*", "a.b.c") and not matches("a.*", "a.b.c")
    assert matches("a.>", "a.b.c") and not matches("a.>", "a")


ROUTES = {
    "runtime": runtime_routes(NS, FAMILIES),
    "executor": executor_routes(NS, "payment"),
    "gateway": gateway_routes(NS),
    "projector": projector_routes(NS, ("send_email", "update_crm")),
    "reconciler": reconciler_routes(NS),
}


@pytest.mark.parametrize("service", sorted(ROUTES))
def test_each_sample_lands_in_its_stream_and_no_other(service: str) -> None:
    for route in ROUTES[service]:
        taking = [s.name for s in stream_specs(NS) if route.taken_by(s.subjects)]
        assert taking == [route.stream], route


def test_the_runtime_proves_a_run_event_of_each_class_and_an_action_of_each_family() -> None:
    runs = [r.subject for r in ROUTES["runtime"] if r.stream == "ROUTES_RUNS"]
    assert runs == [NS.run_event("readyz", kind) for kind in EventClass]
    actions = [r for r in ROUTES["runtime"] if r.stream == "ROUTES_ACTIONS"]
    assert actions == [Route(NS.actions(f, 0), "ROUTES_ACTIONS") for f in FAMILIES]


def test_a_runs_stream_of_the_old_layout_does_not_take_a_run_event() -> None:
    """What the runtime's readiness must catch: RUNS on `<ns>.run.*` (one subject per run) takes no class."""
    assert not any(matches(NS.legacy_run_events_all, r.subject) for r in ROUTES["runtime"])
