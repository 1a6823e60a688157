"""Pure parts of the model gateway and the catalog: what a catalog must satisfy to be published, and the Chat
Completions translation both ways (the runtime's adapter and the sandbox's endpoint)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.catalog import AgentConfig, Catalog, ModelRoute, catalog_decoder, catalog_encoder
from crashsafe.contracts.policy import (
    ApprovalAbove,
    OneActiveHold,
    RefundWithinPaid,
    StayWindow,
    ToolsAllowed,
)
from crashsafe.contracts.run_events import Budget
from crashsafe.domain.catalog_check import builtin_catalog, validate_catalog
from crashsafe.sandbox import chat as sandbox_chat
from crashsafe.sandbox import scripted_model
from crashsafe.services.runtime.chat_completions import (
    MalformedAnswer,
    chat_messages,
    chat_tools,
    read_completion,
)
from crashsafe.services.runtime.model import read_response
from tests.support.inprocess import REGISTRY
from tests.support.world import BOOKING_TEXT

BOOKING = REGISTRY.agent("booking").config


def _with(**changes: Any) -> Catalog:
    return Catalog(agents={"booking": msgspec.structs.replace(BOOKING, **changes)})


def test_the_built_in_catalog_is_valid_and_survives_the_wire() -> None:
    builtin = builtin_catalog(REGISTRY)
    assert validate_catalog(builtin, REGISTRY) == []
    assert catalog_decoder.decode(catalog_encoder.encode(builtin)) == builtin


@pytest.mark.parametrize(
    ("catalog", "problem"),
    [
        (Catalog(agents={}), "names no agent"),
        (Catalog(agents={"concierge": AgentConfig(agent="concierge")}), "agents.concierge: unknown agent"),
        (Catalog(agents={"booking": AgentConfig(agent="steps5")}), "agents.booking.agent is 'steps5'"),
        (
            _with(tools=["search_hotels", "transfer_money"]),
            "['transfer_money'] are not booking's model tools",
        ),
        (
            _with(tools=["release_booking"]),
            "['release_booking'] are not",
        ),  # a compensation, never the model's
        (_with(tools=["search_hotels", "search_hotels"]), "named twice"),
        (_with(rules=[ToolsAllowed(tools=["wire_funds"])]), "rules[0] names tools ['wire_funds']"),
        (_with(rules=[OneActiveHold(tool="nope")]), "rules[0] names tools ['nope']"),
        (_with(rules=[StayWindow(max_nights=0)]), "max_nights must be in 1..365"),
        (_with(rules=[ApprovalAbove(tool="create_payment", limit_cents=-5)]), "limit_cents must be >= 0"),
        (_with(rules=[ApprovalAbove(tool="create_payment", limit_cents=1, ttl_s=0)]), "ttl_s in (0"),
        (
            _with(rules=[ApprovalAbove(tool="create_payment", limit_cents=1, approver="the model")]),
            "approver must be guest or manager",
        ),
        (
            _with(rules=[RefundWithinPaid(tool="refund_payment", payment_field="payment_id")]),
            "names tools ['refund_payment']",
        ),  # booking cannot refund
        (_with(budget=Budget(max_steps=0)), "budget.max_steps must be in 1..1000"),
        (_with(budget=Budget(max_tokens=-1)), "budget.max_tokens"),
        (_with(budget=Budget(deadline_s=float("nan"))), "budget.deadline_s"),
        (_with(budget=Budget(deadline_s=0)), "budget.deadline_s"),
        (_with(max_repeats=0), "max_repeats must be in 1..100"),
        (_with(routes=[ModelRoute(name="a", model="m"), ModelRoute(name="a", model="n")]), "must be unique"),
        (_with(routes=[ModelRoute(name="a", model="m", api="grpc")]), "api 'grpc' is not one of"),
        (_with(routes=[ModelRoute(name="a", model="")]), "model is empty"),
        (_with(routes=[ModelRoute(name="", model="m")]), "name is empty"),
        (_with(routes=[ModelRoute(name="a", model="m", timeout_s=0)]), "timeout_s must be in (0, 600]"),
        (_with(routes=[ModelRoute(name="a", model="m", base_url="file:///etc")]), "must be an http(s) URL"),
        (_with(routes=[ModelRoute(name="a", model="m", api_key_env="$(rm -rf)")]), "must name a `…_API_KEY`"),
        # The key goes to the route's host: naming another secret's variable would send that secret there.
        (_with(routes=[ModelRoute(name="a", model="m", api_key_env="AWS_SECRET_ACCESS_KEY")]), "_API_KEY"),
        (
            _with(routes=[ModelRoute(name="a", model="m", api_key_env="CRASHSAFE_API_KEY")]),
            "outside CRASHSAFE_",
        ),
    ],
)
def test_a_catalog_that_cannot_run_here_is_refused_naming_the_problem(catalog: Catalog, problem: str) -> None:
    problems = validate_catalog(catalog, REGISTRY)
    assert any(problem in p for p in problems), problems


def test_every_problem_is_listed_not_just_the_first() -> None:
    catalog = _with(
        tools=["x"], budget=Budget(max_steps=0), routes=[ModelRoute(name="a", model="m", api="?")]
    )
    assert len(validate_catalog(catalog, REGISTRY)) == 3


def test_a_good_catalog_with_routes_and_rules_is_valid() -> None:
    catalog = _with(
        instructions="Be brief.",
        tools=["search_hotels", "create_booking", "create_payment"],
        rules=[StayWindow(max_nights=14), ApprovalAbove(tool="create_payment", limit_cents=100_000)],
        routes=[
            ModelRoute(name="vllm", model="llama", api="chat_completions", base_url="http://vllm:8000/v1"),
            ModelRoute(name="openai", model="gpt-4.1-mini", timeout_s=20),
        ],
    )
    assert validate_catalog(catalog, REGISTRY) == []


TRANSCRIPT: tuple[dict[str, Any], ...] = (
    {"role": "developer", "content": "Earlier in this session: ..."},
    {"role": "user", "content": BOOKING_TEXT},
    {"type": "function_call", "call_id": "c1", "name": "search_hotels", "arguments": '{"city":"Lisbon"}'},
    {"type": "function_call_output", "call_id": "c1", "output": '{"hotels":[]}'},
    {"type": "function_call", "call_id": "c2", "name": "create_booking", "arguments": "{}"},
    {"type": "function_call", "call_id": "c3", "name": "create_payment", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c2", "output": "{}"},
    {"type": "function_call_output", "call_id": "c3", "output": "{}"},
    {"role": "assistant", "content": "Booked."},
)


def test_the_transcript_becomes_chat_messages() -> None:
    messages = chat_messages("You book rooms.", TRANSCRIPT)
    assert [m["role"] for m in messages] == [
        "system",  # the instructions
        "system",  # a developer message
        "user",
        "assistant",
        "tool",
        "assistant",  # two consecutive calls: one assistant message with both
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[0]["content"] == "You book rooms."
    assert [c["id"] for c in messages[5]["tool_calls"]] == ["c2", "c3"]
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": '{"hotels":[]}'}
    json.dumps(messages)  # plain JSON, as the wire needs


def test_the_sandbox_reads_chat_messages_back_into_the_same_transcript() -> None:
    """The two halves of the dialect agree: what the runtime sends, the sandbox's script sees as sent."""
    assert sandbox_chat.input_items(chat_messages("You book rooms.", TRANSCRIPT)) == list(TRANSCRIPT)


def test_tools_nest_their_name_under_function() -> None:
    tools = chat_tools(
        [{"type": "function", "name": "t", "description": "d", "parameters": {"type": "object"}}]
    )
    assert tools == [
        {"type": "function", "function": {"name": "t", "description": "d", "parameters": {"type": "object"}}}
    ]


def test_the_scripted_model_answers_the_same_over_both_dialects() -> None:
    items = [{"role": "user", "content": BOOKING_TEXT}]
    responses = scripted_model.respond(items)
    completion = sandbox_chat.respond(chat_messages("", tuple(items)))
    via_responses = read_response(json.dumps(responses).encode(), "m")
    via_chat = read_completion(json.dumps(completion).encode(), "m")
    assert [(c.call_id, c.name, c.arguments) for c in via_chat.tool_calls] == [
        (c.call_id, c.name, c.arguments) for c in via_responses.tool_calls
    ]
    assert (via_chat.input_tokens, via_chat.output_tokens) == (
        via_responses.input_tokens,
        via_responses.output_tokens,
    )
    assert via_chat.response_id.startswith("chatcmpl-")


def test_a_text_answer_is_the_reply_and_usage_is_read() -> None:
    raw = b'{"id":"x","model":"m","choices":[{"message":{"content":"Hello"}}],"usage":{"prompt_tokens":7,"completion_tokens":2}}'
    reply = read_completion(raw, "fallback")
    assert (reply.reply, reply.tool_calls, reply.input_tokens, reply.output_tokens, reply.model) == (
        "Hello",
        (),
        7,
        2,
        "m",
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"<html>oops</html>",
        b'{"id":"x","choices":[]}',
        b'{"choices":[{"message":{}}]}',
        b'{"id":"x","choices":"no"}',
        # Negative usage would give the run back its token budget: not an answer to trust.
        b'{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":-60000}}',
    ],
    ids=["not-json", "no-choices", "no-id", "wrong-type", "negative-usage"],
)
def test_a_malformed_chat_answer_is_named_so(raw: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        read_completion(raw, "m")


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"output":[]}',
        b'{"id":"r","output":"x"}',
        b'{"id":"r","output":[],"usage":{"input_tokens":10,"output_tokens":-60000}}',
    ],
)
def test_a_malformed_responses_answer_is_named_so(raw: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        read_response(raw, "m")
