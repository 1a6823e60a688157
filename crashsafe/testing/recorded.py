"""A model that already speaks the Responses protocol, replayed in memory: its recorded answers (JSON as the OpenAI
Responses API returns them) read by the runtime's own reader, so `play` and `Conversation` journal what the
runtime would have journaled from the same answers: calls, their ids, the reply, the model and the token counts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.responses_reading import MalformedAnswer, read_response

# What a recorded answer that names no model is journaled as (the runtime names the route's model there).
RECORDED_MODEL = "recorded"


def read_responses(
    recorded: str | PathLike[str] | Iterable[Mapping[str, Any] | str | bytes],
) -> tuple[ModelReply, ...]:
    """Recorded Responses API answers, in order, as `model=` of `play` or `Conversation` replays them: one each
    time the run asks the model. `recorded` is a file (a JSON array of Responses objects, or one object per line:
    JSON Lines) or the objects themselves (dicts, as `response.model_dump()` of the `openai` SDK gives them, or
    their JSON text). Only what the runtime reads is read (`output`'s function calls and output text, `id`,
    `model`, `usage`); one that is not a Responses object is refused (`MalformedAnswer`, a ValueError), naming
    which, as the runtime would not take it from a model either."""
    answers = _from_file(Path(recorded)) if isinstance(recorded, str | PathLike) else list(recorded)
    replies: list[ModelReply] = []
    for n, answer in enumerate(answers, 1):
        if isinstance(answer, bytes | str):
            raw = answer if isinstance(answer, bytes) else answer.encode()
        else:
            raw = json.dumps(dict(answer)).encode()
        try:
            replies.append(read_response(raw, RECORDED_MODEL))
        except MalformedAnswer as exc:
            raise MalformedAnswer(f"recorded answer {n} of {len(answers)}: {exc}") from exc
    return tuple(replies)


def _from_file(path: Path) -> list[Any]:
    text = path.read_text()
    try:
        whole = json.loads(text)
    except ValueError:
        # JSON Lines: one answer per line (blank lines skipped).
        return [line for line in text.splitlines() if line.strip()]
    return whole if isinstance(whole, list) else [whole]
