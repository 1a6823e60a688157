"""`crashsafe.testing`'s scripted model answers what the runtime's model port reads, the same way every time; and
`crashsafe up --model-url` names the model's URL instead of guessing it from the providers'."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from crashsafe.cli_arguments import build_parser
from crashsafe.examples.cowork.desk_model import CLARIFY, script
from crashsafe.services.runtime.model import read_response
from crashsafe.stack_env import model_at
from crashsafe.testing import Call, ModelTurn, Say, Transcript, respond, step

ASK = {"role": "user", "content": "Book a desk in the quiet zone on 2031-05-01"}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def _output(call_id: str, output: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)}


def test_a_call_and_a_reply_are_read_by_the_runtimes_own_reader() -> None:
    called = read_response(json.dumps(respond(script, {"input": [ASK]})).encode(), "scripted")
    (call,) = called.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("find_desks", {"day": "2031-05-01", "zone": "quiet"})
    assert called.reply is None
    said = read_response(json.dumps(respond(script, {"input": "hello"})).encode(), "scripted")
    assert said.tool_calls == () and said.reply == CLARIFY


def test_the_same_conversation_gets_the_same_answer_and_another_gets_other_ids() -> None:
    body = {"input": [ASK]}
    assert respond(script, body) == respond(script, body)
    other = respond(script, {"input": [{**ASK, "content": "Book a desk in the open zone on 2031-05-01"}]})
    assert other["id"] != respond(script, body)["id"]


def test_the_script_reads_this_turns_calls_with_their_answers_and_what_still_waits() -> None:
    seen: list[Transcript] = []

    def spy(talk: Transcript) -> ModelTurn:
        seen.append(talk)
        return (Call("a", {"x": 1}), Call("b"))

    items = [
        {"role": "user", "content": "earlier"},
        _call("c0", "reserve_desk", {}),
        _output("c0", {"reservation_id": "res_1"}),
        ASK,
        _call("c1", "find_desks", {"day": "2031-05-01"}),
        _output("c1", {"error": {"code": "not_allowed", "message": "no"}}),
        _call("c2", "reserve_desk", {"zone": "quiet"}),
    ]
    answer = respond(spy, {"input": items, "tools": [{"type": "function", "name": "find_desks"}]})
    (talk,) = seen
    assert talk.said == ASK["content"] and talk.tools == frozenset({"find_desks"})
    (result,) = talk.results
    assert (result.name, result.failed, result.error_code) == ("find_desks", True, "not_allowed")
    assert talk.waiting == ("reserve_desk",)
    assert talk.last("reserve_desk") is None and talk.earlier("reserve_desk") is not None
    assert [o["name"] for o in answer["output"]] == ["a", "b"]
    assert len({o["call_id"] for o in answer["output"]}) == 2


def test_a_reply_ends_the_turn_in_text() -> None:
    answer = respond(lambda talk: Say(f"you said {talk.said}"), {"input": "hi"})
    assert [o["type"] for o in answer["output"]] == ["message"]
    assert answer["output"][0]["content"][0]["text"] == "you said hi"


def _stack(**fields: Any) -> Any:
    defaults = {"model_url": None, "base_env": {}, "runs_sandbox": False, "sandbox_url": "http://providers:1"}
    return SimpleNamespace(**{**defaults, **fields})


def test_up_says_which_model_url_the_runtime_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert model_at(_stack(model_url="http://model:2/v1")) == ("http://model:2/v1", "--model-url")
    url, why = model_at(_stack())
    assert url == "http://providers:1/v1" and "no --model-url" in why  # the old silent guess, now said
    assert model_at(_stack(runs_sandbox=True))[1] == "the sandbox's scripted model"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://llm:3/v1")
    assert model_at(_stack()) == ("http://llm:3/v1", "OPENAI_BASE_URL")
    assert model_at(_stack(model_url="http://model:2/v1"))[0] == "http://model:2/v1"  # the flag wins


def test_up_takes_a_model_url_and_refuses_what_is_no_url(capsys: pytest.CaptureFixture[str]) -> None:
    parsed = build_parser().parse_args(["up", "--model-url", "http://127.0.0.1:9/v1"])
    assert parsed.model_url == "http://127.0.0.1:9/v1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--model-url", "model:9"])
    assert "--model-url wants an http(s):// base URL" in capsys.readouterr().err


def test_one_script_answers_a_folded_runs_transcript_for_in_memory_play() -> None:
    run = SimpleNamespace(transcript=(ASK,))
    (call,) = step(script, run).calls  # type: ignore[arg-type]
    assert (call.name, json.loads(call.arguments)) == ("find_desks", {"day": "2031-05-01", "zone": "quiet"})
    assert step(script, SimpleNamespace(transcript=({"role": "user", "content": "hi"},))).reply == CLARIFY  # type: ignore[arg-type]
