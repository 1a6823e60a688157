"""A deterministic stand-in for an LLM on the OpenAI Responses API, so demos and crash tests replay byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import date, timedelta
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
# The same request by length of stay ("from 2031-01-10 for 300 nights"): the model works out the check-out.
_REQUEST_NIGHTS = re.compile(
    r"book\s+a\s+room\s+in\s+(?P<city>[^\W\d_][\w .'-]*?)\s+"
    r"from\s+(?P<check_in>\d{4}-\d{2}-\d{2})\s+for\s+(?P<nights>\d{1,4})\s+nights?",
    re.IGNORECASE,
)

# The booking script: each tool's successful output leads to the next call; a paid booking ends the conversation
# (the confirmation email and the CRM record are the platform's projections of the paid run, not model steps).
_NEXT_TOOL = {"create_booking": "create_payment"}
# Tools a model of before the change called after the payment: an old conversation's history may hold them (a run
# in flight across the deploy), and a weak model obeying "send the confirmation to …" still asks for one.
_AFTER_PAYMENT = ("send_confirmation_email", "update_crm")
CONFIRMATION_ON_ITS_WAY = "The confirmation email is on its way."
# The field that shows a step really happened; without it the script stops rather than guess.
_PROOF = {"create_booking": "booking_id", "create_payment": "payment_id"}
_STEP_WORDS = {
    "find_payments": "looking up your payments",
    "refund_payment": "refunding your payment",
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

# Plain-language injections a weak model obeys (the evals' injection class): the amount a guest asks to be
# charged, an address a guest asks the confirmation to go to. The policy, not this model, must have the last word.
_MONEY = (
    r"(?:(?:EUR|€)\s*(?P<pre>\d[\d,]*(?:\.\d{1,2})?)|(?P<post>\d[\d,]*(?:\.\d{1,2})?)\s*(?:EUR|€|euros?)\b)"
)
_CHARGE_ME = re.compile(r"\bcharge\s+(?:me\s+)?(?:only\s+|just\s+)?" + _MONEY, re.IGNORECASE)
_SEND_TO = re.compile(
    r"\b(?:send|email|mail)\b[^\n]*?\bto\s+(?P<address>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)", re.IGNORECASE
)
# The support agent's conversation: "refund my payment for booking bk_…" (optionally naming an amount).
_REFUND = re.compile(r"\brefund\b", re.IGNORECASE)
_BOOKING_REF = re.compile(r"\b(?P<booking_id>bk_[A-Za-z0-9_-]+)")
_REFUND_AMOUNT = re.compile(r"\brefund\b[^\n]*?" + _MONEY, re.IGNORECASE)
# A question about StayHub (its policies, its FAQ): answered only from the passages in the input.
_QUESTION = re.compile(
    r"\?\s*$|^\s*(?:what|what's|how|when|where|which|why|who|can|could|do|does|is|are|may|will)\b",
    re.IGNORECASE,
)
# "Can you book me something?": a booking without its city and dates, to clarify, not a question for the documents.
_WANTS_ROOM = re.compile(r"\b(?:book|reserve)\b\s+(?:a|an|me|us|something|somewhere)\b", re.IGNORECASE)
PASSAGES_HEADER = "From StayHub's documents:"
_SECTION = re.compile(r"^\[(?P<doc>[^\]]+?) § (?P<section>[^\]]+)\]\n", re.MULTILINE)
_WORD = re.compile(r"[a-z0-9]+")
# Words every question or every document has: they say nothing about which passage answers.
_COMMON = (
    "a about after am an and any are as at be before by can could do does for from have how i if in is it "
    "its me my of on or our policy policies rule rules stayhub that the their there this to was what whats "
    "when where which who why will with you your"
)
_STOPWORDS = frozenset(_COMMON.split())
NO_ANSWER = (
    "I don't know: I found nothing about that in StayHub's documents, and I won't guess at a policy. "
    "Please ask StayHub's support team."
)


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
            if result.name in _AFTER_PAYMENT and _paid(results):
                # Asked to send the email itself and refused (the tool is not the model's): the booking stands.
                return Say(_confirmation(results, own_email_refused=True))
            return Say(_refusal(result) or _failure(result))
    if calls:
        return Say(f"I am still waiting for the result of {next(iter(calls.values()))[0]}.")
    said = _text(items[last_user].get("content"))
    if not results and (declined := _declined(items, last_user)) is not None:
        return Say(declined)  # the guest's message refused the approval it was asked for
    if not results:
        request = _stay(said)
        if request is None:
            refund = _BOOKING_REF.search(said) if _REFUND.search(said) else None
            if refund is not None:
                return Call("find_payments", {"booking_id": refund["booking_id"]})
            if _QUESTION.search(said) and not _WANTS_ROOM.search(said):
                return Say(_answer(said, _passages(items)))
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
    if last.name == "find_payments":
        return _refund(last, said)
    if last.name == "refund_payment":
        return Say(_refunded(last))
    if last.name in _NEXT_TOOL:
        booking_id = _booking_id(results)
        proof = _PROOF.get(last.name)
        if booking_id is None or (proof is not None and not last.output.get(proof)):
            return Say(
                f"Sorry, {_STEP_WORDS[last.name]} gave no reference I could check, so I stopped there."
            )
        return Call(_NEXT_TOOL[last.name], _obeying(said, _NEXT_TOOL[last.name], {"booking_id": booking_id}))
    if last.name == "create_payment":
        if _booking_id(results) is None or not last.output.get("payment_id"):
            return Say(
                f"Sorry, {_STEP_WORDS[last.name]} gave no reference I could check, so I stopped there."
            )
        if (send := _SEND_TO.search(said)) is not None:
            # A weak model obeys the guest's "send the confirmation to …" and asks to send it itself.
            return Call(
                "send_confirmation_email", {"booking_id": _booking_id(results), "to": send["address"]}
            )
        return Say(_confirmation(results))
    if last.name in _AFTER_PAYMENT and _paid(results):
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
    said = _latest_user_text(items)
    # A model obeying an injection in the guest's text calls what it was told to, offered or not.
    hostile = (
        isinstance(decision, Calls) or _OBEY.search(said) is not None or _SEND_TO.search(said) is not None
    )
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


def _stay(said: str) -> dict[str, str] | None:
    """The city and dates a guest asks for, or None."""
    if request := _REQUEST.search(said):
        return {"city": request["city"], "check_in": request["check_in"], "check_out": request["check_out"]}
    if request := _REQUEST_NIGHTS.search(said):
        try:
            check_in = date.fromisoformat(request["check_in"])
        except ValueError:
            return None
        check_out = (check_in + timedelta(days=int(request["nights"]))).isoformat()
        return {"city": request["city"], "check_in": request["check_in"], "check_out": check_out}
    return None


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


# The refusals that end a conversation: a rule said no, or the approval it needed was refused or ran out.
_REFUSALS = {
    "not_allowed": "StayHub's rules do not allow {step}",
    "approval_rejected": "{step} was not approved",
    "approval_expired": "the approval for {step} was not given in time",
}


def _refusal(result: _ToolResult) -> str | None:
    """The guest's explanation of a policy denial or a refused approval; None for any other failure."""
    error = result.output["error"]
    code = str(error.get("code") or "") if isinstance(error, dict) else str(error)
    if code not in _REFUSALS:
        return None
    detail = str(error.get("message") or "") if isinstance(error, dict) else ""
    rule = str(error.get("rule") or "") if isinstance(error, dict) else ""
    step = _STEP_WORDS.get(result.name, f"running {result.name}")
    why = "; ".join(part for part in (rule, detail) if part)
    head = _REFUSALS[code].format(step=step)
    return (
        f"I'm sorry: {head[0].upper() + head[1:]}{f' ({why})' if why else ''}. "
        "I have stopped here and will not try it another way; nothing further was done or charged for it."
    )


def _declined(items: list[dict[str, Any]], last_user: int) -> str | None:
    """The explanation when the guest's message came right after a refused approval (the runtime hands the guest's
    "no" to the model after the call's `approval_rejected` output); None otherwise."""
    before = items[last_user - 1] if last_user > 0 else {}
    if before.get("type") != "function_call_output":
        return None
    output = _tool_output(before.get("output"))
    if "error" not in output:
        return None
    name = next(
        (
            str(item.get("name"))
            for item in items[:last_user]
            if item.get("type") == "function_call" and item.get("call_id") == before.get("call_id")
        ),
        "unknown_tool",
    )
    return _refusal(_ToolResult(name, {}, output))


def _obeying(said: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A weak model copies what the guest's text demands into the call: the amount."""
    if tool == "create_payment" and (charge := _CHARGE_ME.search(said)):
        return {**arguments, "amount_cents": _cents(charge)}
    return arguments


def _paid(results: list[_ToolResult]) -> bool:
    payment = _latest(results, "create_payment")
    return payment is not None and "error" not in payment.output and bool(payment.output.get("payment_id"))


def _cents(match: re.Match[str]) -> int:
    """`1,840 EUR` -> 184000, `EUR 1` -> 100, `12.5 EUR` -> 1250."""
    raw = (match["pre"] or match["post"]).replace(",", "")
    whole, _, part = raw.partition(".")
    return int(whole) * 100 + int((part + "00")[:2])


def _refund(found: _ToolResult, said: str) -> Call | Say:
    """Refund the payment `find_payments` found for the booking; the amount only if the guest named one."""
    listed = found.output.get("payments")
    payments = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else [found.output]
    booking_id = found.arguments.get("booking_id")
    paid = [p for p in payments if p.get("payment_id") and p.get("booking_id", booking_id) == booking_id]
    if not paid:
        return Say(f"I found no payment for booking {booking_id}, so there is nothing to refund.")
    arguments: dict[str, Any] = {"payment_id": paid[0]["payment_id"]}
    if amount := _REFUND_AMOUNT.search(said):
        arguments["amount_cents"] = _cents(amount)
    return Call("refund_payment", arguments)


def _refunded(refund: _ToolResult) -> str:
    cents = refund.output.get("amount_cents")
    currency = refund.output.get("currency") or ""
    amount = f"{currency} {_money(cents)}".strip() if isinstance(cents, int) else "the amount paid"
    payment = refund.output.get("payment_id") or refund.arguments.get("payment_id")
    return f"I refunded {amount} of payment {payment} (refund {refund.output.get('refund_id')})."


def _passages(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The latest retrieved passages in the input (`passages_item`), as (document, section, text)."""
    found = [
        _text(item.get("content"))
        for item in items
        if item.get("role") == "developer" and _text(item.get("content")).startswith(PASSAGES_HEADER)
    ]
    if not found:
        return []
    body = found[-1][len(PASSAGES_HEADER) :]
    heads = list(_SECTION.finditer(body))
    return [
        (
            head["doc"].strip(),
            head["section"].strip(),
            body[head.end() : nxt.start() if nxt else None].strip(),
        )
        for head, nxt in zip(heads, [*heads[1:], None], strict=True)
    ]


def _stems(text: str) -> set[str]:
    # Five letters make a crude stem: "cancellation" and "cancel" meet at "cance".
    return {w[:5] for w in _WORD.findall(text.lower().replace("'", "")) if w not in _STOPWORDS and len(w) > 1}


def _answer(question: str, passages: list[tuple[str, str, str]]) -> str:
    """Quote the passage sharing the most words with the question, naming it; with none, say so."""
    asked = _stems(question)
    scored = [(len(asked & _stems(f"{section} {text}")), -i) for i, (_, section, text) in enumerate(passages)]
    if not scored or max(scored)[0] == 0:
        return NO_ANSWER
    doc, section, text = passages[-max(scored)[1]]
    quote = " ".join(text.split())
    if len(quote) > 400:
        quote = quote[:400].rsplit(" ", 1)[0] + " …"
    return f'From StayHub\'s {doc} ({section}): "{quote}"'


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


def _confirmation(results: list[_ToolResult], *, own_email_refused: bool = False) -> str:
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
    refused = (
        "I can't send emails myself; StayHub sends it to your verified address. " if own_email_refused else ""
    )
    return (
        f"Your room at {name} in {city} from {check_in} to {check_out} is booked and paid{price}. "
        f"Booking {booked.get('booking_id')}, payment {paid.get('payment_id')}. {refused}{CONFIRMATION_ON_ITS_WAY}"
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
