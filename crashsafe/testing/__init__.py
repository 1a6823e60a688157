"""`crashsafe.testing`: what an adopter's tests import to play their agent through the runtime's own decisions,
purely (no broker, no network). Like `crashsafe.sdk`, the public surface: what is not here may change."""

from __future__ import annotations

from crashsafe.testing.harness import (
    START,
    Approve,
    Conversation,
    Failed,
    ModelScript,
    Played,
    ToolAnswer,
    ToolAnswers,
    Unknown,
    ask,
    play,
    reply,
    tool_call,
)

__all__ = [
    "START",
    "Approve",
    "Conversation",
    "Failed",
    "ModelScript",
    "Played",
    "ToolAnswer",
    "ToolAnswers",
    "Unknown",
    "ask",
    "play",
    "reply",
    "tool_call",
]
