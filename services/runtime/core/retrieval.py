"""When a run searches its agent's documents: once per guest turn, before that turn's first model call. Pure."""

from __future__ import annotations

from contracts.catalog import AgentConfig
from services.runtime.core.state import RunState


def retrieval_query(state: RunState, config: AgentConfig) -> str | None:
    """The text to search for before the next model call, or None (retrieval off, or this turn already searched)."""
    return None
