"""The journal as the bus (issue 33): a receipt an executor appends to a run's journal itself is taken only where
its subject names the family that wrote it, and only for the request of that family, key, tool and step the run
journaled; the checks an outcome message gets before the runtime journals it, made where the receipt is folded."""

from __future__ import annotations

import msgspec
import pytest

from crashsafe.contracts.capabilities import OutcomeRefusal
from crashsafe.contracts.journal_bus import read_event
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, UnknownEvent, event_encoder
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.authority import receipt_refusal
from crashsafe.domain.fold import fold_run
from tests.support.runs import SEARCH, Run, receipt, started

pytestmark = pytest.mark.unit


def _pending() -> tuple[Run, ActionRequested]:
    run = Run(started())
    run.answer(SEARCH)
    (requested,) = run.decide()
    assert isinstance(requested, ActionRequested)
    return run, requested


def _bussed(request: ActionRequested, run: Run, **changes: object) -> ActionCompleted:
    """The receipt the request's executor appends itself: its family and tool named."""
    done = msgspec.structs.replace(receipt(request, run.tick()), family=request.family, tool=request.tool)
    return msgspec.structs.replace(done, **changes)


def test_an_executors_own_receipt_completes_its_step() -> None:
    run, requested = _pending()
    done = _bussed(requested, run)
    assert receipt_refusal(run.state, done, requested.family) is None
    after = fold_run(run.state, done)
    assert after.pending == () and after.completed == ((requested, done),)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"family": "payment"}, OutcomeRefusal.WRONG_FAMILY),
        ({"key": "run_x:99"}, OutcomeRefusal.UNREQUESTED),
        ({"tool": "create_payment"}, OutcomeRefusal.WRONG_TOOL),
    ],
    ids=["another_family", "another_key", "another_tool"],
)
def test_a_receipt_for_anything_but_its_request_never_completes_a_step(
    change: dict[str, object], refusal: OutcomeRefusal
) -> None:
    run, requested = _pending()
    forged = _bussed(requested, run, **change)
    family = str(change.get("family", requested.family))
    assert receipt_refusal(run.state, forged, family) is refusal
    after = fold_run(run.state, forged)
    assert after.pending == (requested,) and after.completed == ()


def test_an_unknown_is_settled_only_by_its_own_familys_receipt() -> None:
    run, requested = _pending()
    run.complete(requested.step_no, status=OutcomeStatus.UNKNOWN)
    assert run.state.unknown_step(requested.step_no) is not None
    for forged in (
        _bussed(requested, run, family="payment"),
        _bussed(requested, run, key="run_x:99"),
    ):
        assert fold_run(run.state, forged).completed == run.state.completed
    settled = fold_run(run.state, _bussed(requested, run))
    assert settled.unknown_step(requested.step_no) is None


def test_a_receipt_stands_only_where_its_subject_names_the_family_that_wrote_it() -> None:
    run, requested = _pending()
    data = event_encoder.encode(_bussed(requested, run))
    assert isinstance(read_event(data, requested.family), ActionCompleted)
    assert isinstance(read_event(data), ActionCompleted)  # on a step subject: the runtime's own append
    for subject_family in ("payment", "notify"):
        refused = read_event(data, subject_family)
        assert isinstance(refused, UnknownEvent) and refused.type == f"refused:{subject_family}"
    # Any other event on a receipt subject (an intent, a run's end) is no receipt at all.
    assert isinstance(read_event(event_encoder.encode(requested), requested.family), UnknownEvent)
    # A receipt the runtime journals itself (no family) is never taken from an executor's subject.
    runtime_journaled = event_encoder.encode(receipt(requested, run.tick()))
    assert isinstance(read_event(runtime_journaled, requested.family), UnknownEvent)
