"""`crashsafe.testing.read_responses`: a model that speaks the Responses protocol, replayed from its recorded answers
through `play` and `Conversation` (issue 32, item 9). The recording (tests/support/recorded_responses.jsonl) is four
answers of a reasoning model to the booking conversation, each a whole Responses object (reasoning items, echoed
tools, usage details and all), in the shape the `openai` SDK's own `Response` type validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashsafe.contracts.run_events import ModelAnswered
from crashsafe.domain.responses_reading import MalformedAnswer
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.runtime.model import read_response
from crashsafe.testing import Conversation, ModelScript, play, read_responses
from tests.support.paths import ROOT
from tests.unit.test_testing_harness import PAID, STAY, answers

pytestmark = pytest.mark.unit

RECORDING = ROOT / "tests" / "support" / "recorded_responses.jsonl"
RECORDED = [json.loads(line) for line in RECORDING.read_text().splitlines()]


def test_the_recording_is_what_the_responses_api_returns() -> None:
    from openai.types.responses import Response  # the SDK's type of a Responses API answer (a dev dependency)

    for answer in RECORDED:
        Response.model_validate(answer)
    assert [item["type"] for item in RECORDED[0]["output"]] == ["reasoning", "function_call"]


def test_a_recorded_model_plays_the_booking_through_the_runtimes_decisions() -> None:
    played = play(BookingAgent(), "Book Lisbon 1-3 Feb", model=read_responses(RECORDING), tools=answers(PAID))
    assert played.status == "completed"
    assert played.reply == "Your room at lis-1 is booked for 1-3 February and paid (booking bk_1)."
    assert [tool for tool, _ in played.requested] == ["search_hotels", "create_booking", "create_payment"]
    assert played.requested[1][1] == {"hotel_id": "lis-1", **STAY, "guest_id": "guest_1"}
    # Journaled as the runtime journals an answer it read: the recording's ids, model and token counts.
    journaled = played.of(ModelAnswered)
    assert [(a.response_id, a.model, a.input_tokens, a.output_tokens) for a in journaled] == [
        (r["id"], "o4-mini-2025-04-16", r["usage"]["input_tokens"], r["usage"]["output_tokens"])
        for r in RECORDED
    ]
    assert journaled[0].tool_calls[0].call_id == RECORDED[0]["output"][1]["call_id"]
    # The model was shown each call under the recording's call id, answered by the tool's output.
    outputs = [i for i in played.state.transcript if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [r["output"][1]["call_id"] for r in RECORDED[:3]]


def test_the_runtimes_reader_reads_each_answer_as_the_replay_does() -> None:
    replayed = read_responses(RECORDING)
    assert replayed == tuple(read_response(json.dumps(r).encode(), "recorded") for r in RECORDED)


@pytest.mark.parametrize("form", ["jsonl file", "json array file", "dicts", "json texts", "json bytes"])
def test_every_form_of_a_recording_reads_alike(form: str, tmp_path: Path) -> None:
    array = tmp_path / "recording.json"
    array.write_text(json.dumps(RECORDED, indent=2))
    given: object = {
        "jsonl file": str(RECORDING),
        "json array file": array,
        "dicts": RECORDED,
        "json texts": [json.dumps(r) for r in RECORDED],
        "json bytes": [json.dumps(r).encode() for r in RECORDED],
    }[form]
    assert read_responses(given) == read_responses(RECORDING)  # type: ignore[arg-type]


def test_a_conversation_replays_a_recording_turn_by_turn() -> None:
    model: ModelScript = read_responses(RECORDED)
    talk = Conversation(BookingAgent(), model=model, tools=answers(PAID))
    assert talk.say("Book Lisbon 1-3 Feb").status == "completed"


def test_an_answer_that_is_no_responses_object_is_refused_naming_which() -> None:
    broken = [RECORDED[0], {"output": []}]  # no id: the runtime would fail over from it
    with pytest.raises(MalformedAnswer, match="recorded answer 2 of 2: not a Responses object"):
        read_responses(broken)
