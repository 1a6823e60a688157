"""A scripted model for an adopter's own agent: a plain function over the conversation, answered on the OpenAI
Responses protocol the runtime's model port speaks, so tests and evals replay the same answers byte for byte.

    def script(transcript: Transcript) -> ModelTurn:
        if not transcript.results:
            return Call("find_desks", {"day": "2031-05-04"})
        return Say("Done.")

`respond(script, body)` is the pure core (a Responses request body in, a Responses object out); `step(script,
state)` answers a folded run's transcript (the same items the runtime sends), for in-memory play. Pure: on HTTP
it is `model_server` (`python -m crashsafe.testing MODULE:FUNCTION --port 0`, for `crashsafe up --model-url`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from crashsafe.sdk import RunState, ScriptedStep, ToolCall

MODEL_NAME = "scripted"
# A wall-clock stamp would make two answers to one input differ; the date is arbitrary.
CREATED_AT = 1767225600  # 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class Say:
    """The model answers in text: the turn ends with this reply."""

    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """The model asks for one tool call."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


# One call, several calls in one answer, or a reply.
ModelTurn: TypeAlias = Say | Call | tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A call the model made in this turn and what the runtime answered (a failure, a denial: `error`)."""

    name: str
    arguments: dict[str, Any]
    output: dict[str, Any]

    @property
    def failed(self) -> bool:
        return "error" in self.output

    @property
    def existing(self) -> dict[str, Any] | None:
        """With an `idempotency_conflict`: what the key already holds (`result`, `provider_ref`), told to the
        effect's own account and guest; None otherwise."""
        held = self.output.get("existing")
        return held if isinstance(held, dict) else None

    @property
    def error_code(self) -> str:
        """The failure's code (`not_allowed`, `approval_rejected`, a provider's `card_declined` …), or ""."""
        error = self.output.get("error")
        if isinstance(error, dict):
            return str(error.get("code") or "")
        return str(error or "")


@dataclass(frozen=True, slots=True)
class Transcript:
    """What the model was sent, read for a script: the messages, and this turn's calls with their answers."""

    items: tuple[dict[str, Any], ...]
    # The tools the model was offered (None: the request named none, so any).
    tools: frozenset[str] | None = None
    instructions: str = ""

    @property
    def said(self) -> str:
        """The latest user message: what this turn answers."""
        users = [_text(i.get("content")) for i in self.items if i.get("role") == "user"]
        return users[-1] if users else ""

    @property
    def turn(self) -> tuple[dict[str, Any], ...]:
        """The items after the latest user message."""
        last = max((n for n, i in enumerate(self.items) if i.get("role") == "user"), default=-1)
        return self.items[last + 1 :]

    @property
    def results(self) -> tuple[ToolResult, ...]:
        """This turn's answered calls, in order."""
        return tuple(r for r in _results(self.turn) if isinstance(r, ToolResult))

    @property
    def waiting(self) -> tuple[str, ...]:
        """Calls of this turn with no answer yet (the runtime never asks then; a script may say so)."""
        return tuple(r for r in _results(self.turn) if isinstance(r, str))

    def last(self, name: str | None = None) -> ToolResult | None:
        """The latest answered call of this turn (of tool `name`)."""
        return next((r for r in reversed(self.results) if name is None or r.name == name), None)

    def earlier(self, name: str) -> ToolResult | None:
        """The latest answered call of `name` in the whole conversation (an earlier turn's too)."""
        return next(
            (r for r in reversed(_results(self.items)) if isinstance(r, ToolResult) and r.name == name), None
        )


Script: TypeAlias = Callable[[Transcript], ModelTurn]


def transcript_of(body: Mapping[str, Any]) -> Transcript:
    """A Responses request body as the script reads it."""
    raw = body.get("input", [])
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    tools = body.get("tools")
    names = None
    if isinstance(tools, list):
        names = frozenset(str(t.get("name") or (t.get("function") or {}).get("name")) for t in tools)
    return Transcript(tuple(items), names, str(body.get("instructions") or ""))


def respond(script: Script, body: Mapping[str, Any], *, model: str = MODEL_NAME) -> dict[str, Any]:
    """The complete Responses object the script's answer to `body` is. Ids derive from the input alone."""
    talk = transcript_of(body)
    canonical = json.dumps(list(talk.items), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    seed = hashlib.sha256(canonical.encode()).hexdigest()
    step = sum(1 for item in talk.items if item.get("type") == "function_call")
    reply = script(talk)
    calls = reply if isinstance(reply, tuple) else (reply,) if isinstance(reply, Call) else ()
    output: list[dict[str, Any]] = []
    for n, call in enumerate(calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{_derive(seed, 'fc', step + n)}",
                "call_id": f"call_{_derive(seed, 'call', step + n)}",
                "name": call.name,
                "arguments": json.dumps(dict(call.arguments), separators=(",", ":"), ensure_ascii=False),
                "status": "completed",
            }
        )
    if isinstance(reply, Say):
        output.append(
            {
                "type": "message",
                "id": f"msg_{_derive(seed, 'msg', step)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    produced = reply.text if isinstance(reply, Say) else "".join(str(o["arguments"]) for o in output)
    input_tokens, output_tokens = max(1, len(canonical) // 4), max(1, len(produced) // 4)
    return {
        "id": f"resp_{seed[:32]}",
        "object": "response",
        "created_at": CREATED_AT,
        "model": str(body.get("model") or model),
        "status": "completed",
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
        "parallel_tool_calls": False,
        "error": None,
    }


def step(script: Script, state: RunState) -> ScriptedStep:
    """The script's answer to a folded run, as a model answer an in-memory play takes: the run's transcript is
    what the runtime would send the model, so one script drives the served model and the in-memory play alike."""
    turn = script(Transcript(state.transcript))
    if isinstance(turn, Say):
        return ScriptedStep(reply=turn.text)
    calls = turn if isinstance(turn, tuple) else (turn,)
    return ScriptedStep(
        calls=tuple(
            ToolCall(call_id="", name=c.name, arguments=json.dumps(dict(c.arguments), separators=(",", ":")))
            for c in calls
        )
    )


def _results(items: tuple[dict[str, Any], ...]) -> list[ToolResult | str]:
    """Each call in order: its answer, or its name while unanswered."""
    asked: dict[str, tuple[str, dict[str, Any]]] = {}
    order: list[str] = []
    answered: dict[str, ToolResult] = {}
    for item in items:
        if item.get("type") == "function_call":
            call_id = str(item.get("call_id"))
            asked[call_id] = (str(item.get("name")), _object(item.get("arguments")))
            order.append(call_id)
        elif item.get("type") == "function_call_output":
            call_id = str(item.get("call_id"))
            name, arguments = asked.get(call_id, ("unknown_tool", {}))
            answered[call_id] = ToolResult(name, arguments, _output(item.get("output")))
    return [answered.get(c) or asked[c][0] for c in order]


def _derive(seed: str, label: str, step: int) -> str:
    return hashlib.sha256(f"{seed}:{label}:{step}".encode()).hexdigest()[:24]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _object(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {}


def _output(raw: Any) -> dict[str, Any]:
    """A tool's answer as an object; a list is `{"items": [...]}`; anything unreadable is a failure, never a guess."""
    try:
        parsed = (
            json.loads(_text(raw) if isinstance(raw, list) else raw) if isinstance(raw, str | list) else raw
        )
    except ValueError:
        parsed = None
    if isinstance(parsed, list):
        return {"items": parsed}
    if isinstance(parsed, dict):
        return parsed
    return {
        "error": {"code": "malformed_tool_output", "message": "the tool answered with something not JSON"}
    }
