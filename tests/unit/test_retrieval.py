"""Retrieval: the library's search (sections, determinism, a floor for unrelated text) and the once-per-turn rule."""

from __future__ import annotations

from datetime import timedelta

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.run_events import ModelRejected, Passage, TurnReceived
from crashsafe.domain.decide import Append, next_move
from crashsafe.domain.fold import fold_run, passages_item
from crashsafe.domain.model_calls import model_answered
from crashsafe.domain.retrieval import retrieval_query
from crashsafe.domain.run_state import RunState
from crashsafe.services.knowledge.library import Library, sections
from tests.support.runs import BOOKING, SEARCH, T0, receipt, reply_of, started

ON = AgentConfig(agent="booking", retrieval=True)
OFF = AgentConfig(agent="booking", retrieval=False)
LIBRARY = Library.stayhub()


# The library ----------------------------------------------------------------------------------------------------


def test_a_document_is_split_by_heading_into_sections_named_by_its_title() -> None:
    found = sections("fees", "# Fees\n\nintro line\n\n## Parking\nTen euros\na night.\n\n## Pets\n\nNone.\n")

    assert [(s.doc, s.section, s.text) for s in found] == [
        ("Fees", "Fees", "intro line"),
        ("Fees", "Parking", "Ten euros a night."),
        ("Fees", "Pets", "None."),
    ]


def test_the_cancellation_policy_question_finds_the_cancellation_sections_first() -> None:
    passages = LIBRARY.search("What is the cancellation policy?")

    assert passages, "the cancellation policy must be found"
    assert passages[0].doc == "Cancellation policy"
    assert {p.section for p in passages} <= {
        "Free cancellation",
        "Late cancellation",
        "How to cancel",
        "No-show",
    }
    assert "48 hours" in " ".join(p.text for p in passages)
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)


def test_a_refund_question_finds_the_refund_rule() -> None:
    passages = LIBRARY.search("can I get a 1,840 EUR loyalty refund?")

    assert (passages[0].doc, passages[0].section) == ("Payments and refunds", "Refunds")
    assert "150 EUR" in passages[0].text


def test_unrelated_text_gets_nothing() -> None:
    for text in ("hello", "thanks, bye!", "what is it?", "", "   ", "do you allow pets?"):
        assert LIBRARY.search(text) == [], text


def test_the_same_question_gives_the_same_passages_in_any_library_built_from_the_same_documents() -> None:
    again = Library.stayhub()
    for question in ("cancellation policy", "late check-in", "refund", "corporate manager approval"):
        first = LIBRARY.search(question)
        assert first == LIBRARY.search(question) == again.search(question), question
        assert len(first) <= 3


def test_query_syntax_in_a_guests_text_is_only_words() -> None:
    for text in ('title:"Corporate" AND body:[a TO z]', "cancellation^100 OR -refund*", "(((", "a" * 5000):
        assert LIBRARY.search(text) == LIBRARY.search(text)  # never raises, never reads syntax
    assert LIBRARY.search("title:cancellation") == LIBRARY.search("title cancellation")


def test_limit_bounds_the_passages() -> None:
    assert len(LIBRARY.search("check-in check-out late early", limit=1)) == 1
    assert LIBRARY.search("cancellation", limit=0) == []


def test_an_empty_library_finds_nothing() -> None:
    assert Library().search("cancellation policy") == []


# The query rule -------------------------------------------------------------------------------------------------

PASSAGES = [
    Passage(doc="Cancellation policy", section="Free cancellation", text="Free until 48 hours.", score=5.0)
]


def _first(text: str = "What is the cancellation policy?") -> RunState:
    return fold_run(None, started(text=text))


def _answered(state: RunState, passages: list[Passage], *calls: object) -> RunState:
    event = model_answered(
        state, reply_of(tuple(calls) if calls else (), None if calls else "ok"), T0, passages
    )
    return fold_run(state, event)


def test_the_first_text_is_searched_before_the_first_model_call() -> None:
    assert retrieval_query(_first(), ON) == "What is the cancellation policy?"


def test_retrieval_off_never_searches() -> None:
    assert retrieval_query(_first(), OFF) is None


def test_a_turn_is_searched_once_whatever_the_passages_found() -> None:
    state = _answered(_first(), [], SEARCH)  # nothing found is still searched: the model answered after it

    assert retrieval_query(state, ON) is None


def test_a_refused_answer_does_not_count_as_searched_and_its_note_is_not_the_guests_text() -> None:
    state = _first()
    refused = ModelRejected(
        run_id=state.run_id,
        at=T0,
        step_no=1,
        model="m",
        response_id="resp_1",
        error=ErrorInfo(code="model_answer_too_large", message="too big"),
    )
    state = fold_run(state, refused)

    assert retrieval_query(state, ON) == "What is the cancellation policy?"


def test_a_later_turn_is_searched_once_it_joins_the_transcript() -> None:
    state = _answered(_first("Book a room in Lisbon"), [])
    queued = fold_run(
        state,
        TurnReceived(
            run_id=state.run_id,
            at=T0 + timedelta(seconds=1),
            event_id="e2",
            text="and the cancellation policy?",
        ),
    )

    assert retrieval_query(queued, ON) == "and the cancellation policy?"
    assert retrieval_query(_answered(queued, PASSAGES), ON) is None


def test_a_turn_still_in_the_inbox_is_not_searched_yet() -> None:
    state = _answered(_first("Book a room in Lisbon"), [], SEARCH)  # a call is open: turns wait in the inbox
    queued = fold_run(
        state, TurnReceived(run_id=state.run_id, at=T0, event_id="e2", text="what about refunds?")
    )

    assert queued.inbox
    assert retrieval_query(queued, ON) is None


def test_turns_flushed_together_are_searched_together_in_order() -> None:
    state = _answered(_first("Book a room in Lisbon"), [], SEARCH)
    move = next_move(state, BOOKING, T0)
    assert isinstance(move, Append)
    for event in move.events:
        state = fold_run(state, event)
    for n, text in enumerate(("cancellation?", "and refunds?")):
        state = fold_run(state, TurnReceived(run_id=state.run_id, at=T0, event_id=f"e{n}", text=text))
    assert retrieval_query(state, ON) is None  # the search is still pending: both wait in the inbox

    state = fold_run(state, receipt(state.pending[0], T0))

    assert not state.inbox
    assert retrieval_query(state, ON) == "cancellation?\nand refunds?"


def test_journaled_passages_are_in_the_transcript_where_the_model_saw_them() -> None:
    state = _answered(_first(), PASSAGES)

    assert passages_item(PASSAGES) in state.transcript
    assert state.transcript.index(passages_item(PASSAGES)) == len(state.transcript) - 2  # before the reply
