"""The `fixed` model route: a deterministic answer from the runtime's own process, for the synthetic turn.

A probe that runs every few minutes must not be a paid model call each time, yet it should cross the model port
as every run does: the route is picked, the answer is read by the same Responses parser and journaled as a
`run.model_answered`. Only the synthetic agent's built-in configuration names this route; a deployment that wants
its paid provider probed too gives the `synthetic` agent a real route in the catalog (one small call per turn).
Pure: the same transcript gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from crashsafe.contracts.synthetic_turn import FIXED_MODEL, SYNTHETIC_PREFIX
from crashsafe.domain.probe import probe_calls

_SEARCH = re.compile(
    re.escape(SYNTHETIC_PREFIX)
    + r"\s+(?P<city>[^\W\d_][\w .'-]*?)\s+from\s+(?P<check_in>\d{4}-\d{2}-\d{2})\s+to\s+(?P<check_out>\d{4}-\d{2}-\d{2})",
    re.IGNORECASE,
)
NOT_SYNTHETIC = "synthetic: not a synthetic search (say: synthetic search <city> from <date> to <date>)"


def _digest(items: tuple[dict[str, Any], ...]) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _latest_user_text(items: tuple[dict[str, Any], ...]) -> str:
    for item in reversed(items):
        content = item.get("content")
        if item.get("role") == "user" and isinstance(content, str):
            return content
    return ""


def _reply_to(output: str) -> str:
    try:
        answer = json.loads(output)
    except ValueError:
        return "synthetic: failed: the search's output is not JSON"
    if not isinstance(answer, dict):
        return "synthetic: failed: the search's output is not an object"
    if "error" in answer:
        error = answer["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return f"synthetic: failed: the search failed: {str(message)[:200]}"
    hotels = answer.get("hotels")
    if not isinstance(hotels, list):
        return "synthetic: failed: the search answered no hotel list"
    return f"synthetic: ok: {len(hotels)} hotel(s) found"


def _probe_answer(
    items: tuple[dict[str, Any], ...], calls: list[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """A declared probe's next move (`domain/probe.py`): its next call once the one before is answered, then a
    reply saying how it went."""
    latest = max((n for n, i in enumerate(items) if i.get("role") == "user"), default=-1)
    answered = [
        str(i.get("output", "")) for i in items[latest + 1 :] if i.get("type") == "function_call_output"
    ]
    for output in answered:
        try:
            answer = json.loads(output)
        except ValueError:
            return [_said("synthetic: failed: a call's output is not JSON")]
        if not isinstance(answer, dict) or "error" in answer:
            error = answer.get("error") if isinstance(answer, dict) else answer
            message = error.get("message", error) if isinstance(error, dict) else error
            return [_said(f"synthetic: failed: a call failed: {str(message)[:200]}")]
    if len(answered) >= len(calls):
        return [_said(f"synthetic: ok: {len(calls)} call(s) answered")]
    tool, arguments = calls[len(answered)]
    return [
        {
            "type": "function_call",
            "call_id": f"call_{_digest(items)[:16]}",
            "name": tool,
            "arguments": json.dumps(arguments, sort_keys=True),
        }
    ]


def fixed_answer(items: tuple[dict[str, Any], ...], model: str = FIXED_MODEL) -> bytes:
    """A Responses API object answering `items`: a declared probe's calls one by one, then how they went; the
    search's result once it is in the transcript, else the search the guest's `synthetic search …` message asks
    for, else a reply saying it is not one."""
    output: list[dict[str, Any]]
    calls = probe_calls(_latest_user_text(items))
    if calls is not None:
        body = {
            "id": f"resp_{_digest(items)}",
            "model": model,
            "output": _probe_answer(items, calls),
            "usage": None,
        }
        return json.dumps(body).encode()
    last_output = next((i for i in reversed(items) if i.get("type") == "function_call_output"), None)
    if last_output is not None:
        output = [_said(_reply_to(str(last_output.get("output", ""))))]
    else:
        match = _SEARCH.search(_latest_user_text(items))
        if match is None:
            output = [_said(NOT_SYNTHETIC)]
        else:
            arguments = {k: match.group(k).strip() for k in ("city", "check_in", "check_out")}
            output = [
                {
                    "type": "function_call",
                    "call_id": f"call_{_digest(items)[:16]}",
                    "name": "search_hotels",
                    "arguments": json.dumps(arguments, sort_keys=True),
                }
            ]
    body = {"id": f"resp_{_digest(items)}", "model": model, "output": output, "usage": None}
    return json.dumps(body).encode()
