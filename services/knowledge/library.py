"""The searchable documents of a deployment's agents: built once at start, searched before a turn's first model call."""

from __future__ import annotations

from contracts.run_events import Passage


class Library:
    def search(self, query: str, limit: int = 3) -> list[Passage]:
        return []
