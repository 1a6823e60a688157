"""A deterministic stand-in for an LLM on the OpenAI Responses API, so demos and crash tests replay byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

MODEL_NAME = "scripted-booking"
# A wall-clock stamp would make two answers to one input differ; the date is arbitrary.
CREATED_AT = 1767225600  # 2026-01-01T00:00:00Z

CLARIFYING_QUESTION = "Which city and dates? e.g. 'Book a room in Lisbon from 2031-12-01 to 2031-12-03'"

_REQUEST = re.compile(
    r"book\s+a\s+room\s+in\s+(?P<city>[^\W\d_][\w .'-]*?)\s+"
    r"from\s+(?P<check_in>\d{4}-\d{2}-\d{2})\s+to\s+(?P<check_out>\d{4}-\d{2}-\d{2})",
    re.IGNORECASE,
)

# The booking script: each tool's successful output leads to the next call.
_NEXT_TOOL = {
    "create_booking": "create_payment",
    "create_payment": "send_confirmation_email",
    "send_confirmation_email": "update_crm",
}
# The field that shows a step really happened; without it the script stops rather than guess.
_PROOF = {"create_booking": "booking_id", "create_payment": "payment_id"}
_STEP_WORDS = {
    "search_hotels": "searching for hotels",
    "create_booking": "reserving the room",
    "create_payment": "taking the payment",
    "send_confirmation_email": "sending the confirmation email",
    "update_crm": "updating your guest profile",
}


class Call(NamedTuple):
    """The model asks for one tool call."""

    name: str
    arguments: dict[str, Any]


class Say(NamedTuple):
    """The model answers in text and the turn ends."""

    text: str


class Calls(NamedTuple):
    """The model asks for several tool calls in one answer."""

    calls: tuple[Call, ...]


# A hostile model's script, written in the guest's own message: the scripted model obeys every line, in order,
# one answer per line (`obey+:` joins the line before it in the same answer). `$field` is the latest tool
# output's value of that field in the turn (`$booking_id`). The evals and the attack tests use it to play a
# model that does exactly what an injection in the guest's text asks.
_OBEY = re.compile(r"^\s*obey(?P<join>\+)?:\s*(?P<name>[A-Za-z_][\w]*)\s*(?P<args>\{.*\})?\s*$", re.MULTILINE)
_VAR = re.compile(r"\$(?P<field>[a-z_]+)")


class _ToolResult(NamedTuple):
    name: str
    arguments: dict[str, Any]
    output: dict[str, Any]


def normalise_input(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses API accepts a bare string as one user message."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return raw


def _obeyed(text: str, turn: list[dict[str, Any]]) -> Call | Calls | Say | None:
    """The next answer of a hostile script in the guest's text, or None if the text has none."""
    lines = list(_OBEY.finditer(text))
    if not lines:
        return None
    answers: list[list[re.Match[str]]] = []
    for line in lines:
        if line["join"] and answers:
            answers[-1].append(line)
        else:
            answers.append([line])
    answered = sum(1 for item in turn if item.get("type") == "function_call")
    outputs = [_tool_output(i.get("output")) for i in turn if i.get("type") == "function_call_output"]
    done = 0
    for answer in answers:
        if done >= answered:
            calls = tuple(Call(m["name"], _filled(m["args"] or "{}", outputs)) for m in answer)
            return calls[0] if len(calls) == 1 else Calls(calls)
        done += len(answer)
    summary = "; ".join(
        str(o.get("error", {}).get("code") if isinstance(o.get("error"), dict) else "ok") for o in outputs
    )
    return Say(f"Done as asked: {summary}")


def _filled(raw: str, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    def value(match: re.Match[str]) -> str:
        for output in reversed(outputs):
            if match["field"] in output:
                return str(output[match["field"]])
        return match.group(0)

    return _json_object(_VAR.sub(value, raw))


def decide(items: list[dict[str, Any]]) -> Call | Calls | Say:
    """The whole script. State is read from the input items alone, so any replay gives the same step."""
    last_user = max((i for i, item in enumerate(items) if item.get("role") == "user"), default=None)
    if last_user is None:
        return Say(CLARIFYING_QUESTION)
    turn = items[last_user + 1 :]
    hostile = _obeyed(_text(items[last_user].get("content")), turn)
    if hostile is not None:
        return hostile

    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    results: list[_ToolResult] = []
    for item in turn:
        kind = item.get("type")
        if kind == "function_call":
            calls[str(item.get("call_id"))] = (str(item.get("name")), _json_object(item.get("arguments")))
        elif kind == "function_call_output":
            name, arguments = calls.pop(str(item.get("call_id")), ("unknown_tool", {}))
            results.append(_ToolResult(name, arguments, _tool_output(item.get("output"))))

    for result in results:
        if "error" in result.output:
            return Say(_failure(result))
    if calls:
        return Say(f"I am still waiting for the result of {next(iter(calls.values()))[0]}.")
    if not results:
        request = _REQUEST.search(_text(items[last_user].get("content")))
        if request is None:
            return Say(CLARIFYING_QUESTION)
        return Call(
            "search_hotels",
            {
                "city": request["city"].strip(),
                "check_in": request["check_in"],
                "check_out": request["check_out"],
            },
        )

    last = results[-1]
    if last.name == "search_hotels":
        return _choose_hotel(last)
    if last.name in _NEXT_TOOL:
        booking_id = _booking_id(results)
        proof = _PROOF.get(last.name)
        if booking_id is None or (proof is not None and not last.output.get(proof)):
            return Say(
                f"Sorry, {_STEP_WORDS[last.name]} gave no reference I could check, so I stopped there."
            )
        return Call(_NEXT_TOOL[last.name], {"booking_id": booking_id})
    if last.name == "update_crm":
        return Say(_confirmation(results))
    return Say(f"I did not expect a result from {last.name}. {CLARIFYING_QUESTION}")


def respond(
    input_items: str | list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    model: str = MODEL_NAME,
) -> dict[str, Any]:
    """A complete Responses API response object for `input_items`, as JSON-able data.

    `tools=None` means "any tool"; a list restricts the script to the tools it names.
    """
    items = normalise_input(input_items)
    canonical = json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    seed = hashlib.sha256(canonical.encode()).hexdigest()
    step = sum(1 for item in items if item.get("type") == "function_call")

    decision = decide(items)
    hostile = isinstance(decision, Calls) or _OBEY.search(_latest_user_text(items)) is not None
    if (
        isinstance(decision, Call)
        and not hostile
        and tools is not None
        and decision.name not in _tool_names(tools)
    ):
        # A well-behaved model calls only the tools it was offered; a hostile one calls whatever it likes.
        decision = Say(f"I can't do that here: the {decision.name} tool is not available.")

    outputs: list[dict[str, Any]]
    if isinstance(decision, (Call, Calls)):
        calls = decision.calls if isinstance(decision, Calls) else (decision,)
        outputs = []
        for index, call in enumerate(calls):
            arguments = json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
            outputs.append(
                {
                    "type": "function_call",
                    "id": f"fc_{_derive(seed, 'fc', step + index)}",
                    "call_id": f"call_{_derive(seed, 'call', step + index)}",
                    "name": call.name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        produced = "".join(str(o["arguments"]) for o in outputs)
    else:
        outputs = [
            {
                "type": "message",
                "id": f"msg_{_derive(seed, 'msg', step)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": decision.text, "annotations": []}],
            }
        ]
        produced = decision.text

    input_tokens = max(1, len(canonical) // 4)
    output_tokens = max(1, len(produced) // 4)
    return {
        "id": f"resp_{seed[:32]}",
        "object": "response",
        "created_at": CREATED_AT,
        "completed_at": CREATED_AT,
        "model": model,
        "status": "completed",
        "output": outputs,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
    }


def _latest_user_text(items: list[dict[str, Any]]) -> str:
    users = [item for item in items if item.get("role") == "user"]
    return _text(users[-1].get("content")) if users else ""


def _derive(seed: str, label: str, step: int) -> str:
    return hashlib.sha256(f"{seed}:{label}:{step}".encode()).hexdigest()[:24]


def _tool_names(tools: list[dict[str, Any]]) -> set[str]:
    # Responses tools carry "name" at the top; chat-completions style nests it under "function".
    names = set()
    for tool in tools:
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if name:
            names.add(str(name))
    return names


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _json_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {}


def _tool_output(raw: Any) -> dict[str, Any]:
    """A tool output as a JSON object; anything unreadable counts as a failed step, never a guess."""
    if isinstance(raw, list):  # output given as content parts
        raw = _text(raw)
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parsed = None
    if isinstance(parsed, list):
        return {"hotels": parsed}
    if isinstance(parsed, dict):
        return parsed
    return {
        "error": {"code": "malformed_tool_output", "message": "the tool answered with something not JSON"}
    }


def _failure(result: _ToolResult) -> str:
    error = result.output["error"]
    if isinstance(error, dict):
        code = str(error.get("code") or "unknown_error")
        detail = str(error.get("message") or "")
    else:
        code, detail = str(error), ""
    step = _STEP_WORDS.get(result.name, f"running {result.name}")
    reason = f"{code}: {detail}" if detail else code
    return (
        f"I'm sorry, I couldn't complete your booking: something went wrong while {step} ({reason}). "
        "I have stopped here and not retried anything, so nothing will be charged twice. "
        "Please try again later or contact support with this error code."
    )


def _choose_hotel(search: _ToolResult) -> Call | Say:
    hotels = search.output.get("hotels")
    offers = hotels if isinstance(hotels, list) else []
    chosen = next(
        (h for h in offers if isinstance(h, dict) and h.get("available") is True and h.get("hotel_id")), None
    )
    if chosen is None:
        city = search.arguments.get("city", "that city")
        return Say(
            f"Sorry, no hotels are available in {city} from {search.arguments.get('check_in')} "
            f"to {search.arguments.get('check_out')}. Would you like to try other dates or another city?"
        )
    return Call(
        "create_booking",
        {
            "hotel_id": chosen["hotel_id"],
            "check_in": search.arguments.get("check_in"),
            "check_out": search.arguments.get("check_out"),
        },
    )


def _latest(results: list[_ToolResult], name: str) -> _ToolResult | None:
    return next((r for r in reversed(results) if r.name == name), None)


def _booking_id(results: list[_ToolResult]) -> str | None:
    booking = _latest(results, "create_booking")
    value = booking.output.get("booking_id") if booking else None
    return str(value) if value else None


def _confirmation(results: list[_ToolResult]) -> str:
    search = _latest(results, "search_hotels")
    booking = _latest(results, "create_booking")
    payment = _latest(results, "create_payment")
    booked = booking.output if booking else {}
    paid = payment.output if payment else {}
    hotel = _hotel(search, booked.get("hotel_id"))
    name = booked.get("hotel_name") or hotel.get("name") or booked.get("hotel_id", "your hotel")
    city = booked.get("city") or hotel.get("city") or (search.arguments.get("city") if search else "")
    check_in = booked.get("check_in") or (booking.arguments.get("check_in") if booking else "")
    check_out = booked.get("check_out") or (booking.arguments.get("check_out") if booking else "")
    cents = paid.get("amount_cents", booked.get("total_cents"))
    currency = paid.get("currency") or booked.get("currency") or ""
    price = f" ({currency} {_money(cents)})" if isinstance(cents, int) else ""
    return (
        f"Your room at {name} in {city} from {check_in} to {check_out} is booked and paid{price}. "
        f"Booking {booked.get('booking_id')}, payment {paid.get('payment_id')}."
    )


def _hotel(search: _ToolResult | None, hotel_id: Any) -> dict[str, Any]:
    hotels = search.output.get("hotels") if search else None
    if isinstance(hotels, list):
        for hotel in hotels:
            if isinstance(hotel, dict) and hotel.get("hotel_id") == hotel_id:
                return hotel
    return {}


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"
