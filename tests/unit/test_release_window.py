"""The verdicts over version heartbeats: whether a release may roll out beside what runs, whether a rollout has
converged, and what keeps a contracting step from running (crashsafe/domain/release_window.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crashsafe.contracts.heartbeats import VersionBeat
from crashsafe.domain.release_window import (
    STALE_AFTER_S,
    Waiting,
    Window,
    check,
    contract_blockers,
    convergence,
    live,
    runs_beside,
    unheard,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
WINDOW = Window(current="0.2.0", since="0.1.0")


def beat(
    version: str, service: str = "runtime", worker: str = "w1", since: str = "0.1.0", age_s: float = 1.0
) -> VersionBeat:
    at = NOW - timedelta(seconds=age_s)
    return VersionBeat(
        version=version,
        runs_beside_since=since,
        service=service,
        worker=worker,
        pid=7,
        started_at=at - timedelta(minutes=5),
        beat_at=at,
    )


@pytest.mark.parametrize(
    ("version", "since", "expected"),
    [
        ("0.2.0", "0.1.0", True),
        ("0.1.0", "0.0.1", True),  # the window's oldest
        ("0.1.5", "0.1.0", True),
        ("0.0.9", "0.0.1", False),  # older than the window
        ("0.3.0", "0.2.0", True),  # newer, and its own window reaches back to 0.2.0
        ("0.3.0", "0.2.1", False),  # newer, and it no longer runs beside 0.2.0
        ("0.2.0-rc1", "0.1.0", True),  # a pre-release orders as its release
        ("dev", "0.1.0", False),  # not a version: never vouched for
    ],
)
def test_a_release_runs_beside_the_window_and_the_newer_ones_that_accept_it(
    version: str, since: str, expected: bool
) -> None:
    assert runs_beside(beat(version, since=since), WINDOW) is expected


def test_a_heartbeat_past_its_staleness_is_not_live_and_the_rest_come_ordered() -> None:
    old = beat("0.2.0", "runtime", "w9", age_s=STALE_AFTER_S + 1)
    b, a = beat("0.2.0", "runtime", "w2"), beat("0.2.0", "gateway", "w1")
    assert live([old, b, a], NOW) == [a, b]


def test_the_check_names_the_incompatible_processes() -> None:
    ok, old = beat("0.2.0", worker="w1"), beat("0.0.9", worker="w2")
    verdict = check([ok, old], [], WINDOW, assumed="0.1.0")
    assert not verdict.ok and verdict.incompatible == [old]
    assert check([ok], [], WINDOW, assumed="0.1.0").ok
    assert check([], [], WINDOW, assumed=None).ok  # nothing runs: anything may roll out


def test_a_process_without_a_heartbeat_is_taken_to_run_the_assumed_release() -> None:
    pulling = [Waiting("runtime", "INBOUND/runtime_inbound", 1)]
    verdict = check([], pulling, WINDOW, assumed="0.1.0")
    assert verdict.ok and [u.service for u in verdict.unheard] == ["runtime"]
    assert not check([], pulling, WINDOW, assumed="0.0.9").ok  # the assumed release is outside the window
    assert not check([], pulling, WINDOW, assumed=None).ok  # nothing recorded to assume


def test_pull_requests_beyond_the_heartbeats_of_their_service_are_unheard_of_processes() -> None:
    waiting = [
        Waiting("runtime", "INBOUND/runtime_inbound", 2),
        Waiting("projector", "RUNS/projector_planner", 1),
    ]
    beats = [beat("0.2.0", "runtime", "w1"), beat("0.2.0", "gateway", "w2"), beat("0.2.0", "projector", "w3")]
    (extra,) = unheard(waiting, beats)
    assert (extra.service, extra.consumers, extra.count) == ("runtime", ("INBOUND/runtime_inbound",), 1)
    # One process pulls on each of its durables: seen on two, it is still one process.
    both = [
        Waiting("runtime", "INBOUND/runtime_inbound", 1),
        Waiting("runtime", "OUTCOMES/runtime_outcomes", 1),
    ]
    (one,) = unheard(both, [])
    assert one.count == 1 and one.consumers == ("INBOUND/runtime_inbound", "OUTCOMES/runtime_outcomes")
    assert str(one) == (
        "runtime without a heartbeat (a release before 0.2.0; seen pulling on INBOUND/runtime_inbound,"
        " OUTCOMES/runtime_outcomes)"
    )
    # Any heartbeat of the service explains a request: an older process is named by its own heartbeat.
    assert unheard([Waiting("runtime", "c", 1)], [beat("0.1.9", "runtime", "w1")]) == []


def test_status_converges_only_on_one_release_with_nothing_unheard() -> None:
    one = [beat("0.2.0", "runtime", "w1"), beat("0.2.0", "gateway", "w2")]
    assert convergence(one, []).converged_on == "0.2.0"
    mixed = convergence([*one, beat("0.1.9", "executor-payment", "w3")], [])
    assert mixed.converged_on is None
    assert mixed.mixed() == "0.1.9: executor-payment w3; 0.2.0: runtime w1, gateway w2"
    hidden = convergence(one, [Waiting("runtime", "INBOUND/runtime_inbound", 2)])
    assert hidden.converged_on is None and "runtime without a heartbeat" in hidden.mixed()
    assert convergence([], []).converged_on is None


def test_a_contracting_step_is_blocked_by_every_older_or_unheard_process() -> None:
    beats = [beat("0.2.0", "runtime", "w1"), beat("0.1.0", "gateway", "w2"), beat("x", "reconciler", "w3")]
    waiting = [Waiting("projector", "RUNS/projector_planner", 1)]
    assert contract_blockers(beats, waiting, current="0.2.0") == [
        "gateway w2 0.1.0",
        "reconciler w3 x",
        "projector without a heartbeat (a release before 0.2.0; seen pulling on RUNS/projector_planner)",
    ]
    # This release's (and newer) processes, whose requests their heartbeats account for: nothing blocks.
    current = [beat("0.2.0", "runtime", "w1"), beat("0.3.0", "projector", "w2", since="0.2.0")]
    assert (
        contract_blockers(current, [Waiting("runtime", "c", 1), Waiting("projector", "p", 1)], "0.2.0") == []
    )
