"""What an adopter's own tests and evals use: a scripted model for their agent (`crashsafe.testing.scripted`)."""

from __future__ import annotations

from crashsafe.testing.scripted import Call, Conversation, Reply, Say, Script, ToolResult, respond, serve

__all__ = ["Call", "Conversation", "Reply", "Say", "Script", "ToolResult", "respond", "serve"]
