"""When a run searches its agent's documents: once per guest turn, before that turn's first model call. Pure."""

from __future__ import annotations

import re

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.domain.run_state import RunState

# The runtime's own notes to the model (a refused answer) are user messages too; they are not the guest's words.
RUNTIME_NOTE = "(runtime)"


def guest_turns_heard(state: RunState) -> int:
    """Guest turns the model has been shown: the first text and every turn flushed from the inbox since."""
    return state.turns - len(state.inbox)


def retrieval_query(state: RunState, config: AgentConfig) -> str | None:
    """The text to search for before the next model call, or None (retrieval off, or this turn already searched).

    A turn counts as searched once a model answer is journaled after it (`searched_turns`, folded from
    `run.model_answered`): the passages that answer used are in its event, so a replay never searches. Turns
    flushed together are searched together, in the order the guest sent them."""
    if not config.retrieval or state.terminal:
        return None
    fresh = guest_turns_heard(state) - state.searched_turns
    if fresh <= 0:
        return None
    said: list[str] = []
    for item in reversed(state.transcript):
        if len(said) == fresh:
            break
        content = item.get("content")
        if item.get("role") == "user" and isinstance(content, str) and not content.startswith(RUNTIME_NOTE):
            said.append(content)
    text = "\n".join(reversed(said)).strip()
    return text or None


# A question about the house (its policies, its FAQ), as opposed to a request to do something: the turns the
# documents answer. Only read while the documents are missing, to hand such a turn to a person.
_QUESTION = re.compile(
    r"\?\s*$|^\s*(?:what|what's|how|when|where|which|why|who|can|could|do|does|is|are|may|will)\b",
    re.IGNORECASE | re.MULTILINE,
)
# "Can you book me a room in Lisbon …?": a request, which the agent's tools serve without any document.
_WANTS_ACTION = re.compile(r"\b(?:book|reserve|refund|cancel my)\b", re.IGNORECASE)


def policy_question(text: str) -> bool:
    """True for a turn that asks about the house rather than for an action (pure; the guest's words only)."""
    return bool(_QUESTION.search(text)) and not _WANTS_ACTION.search(text)
