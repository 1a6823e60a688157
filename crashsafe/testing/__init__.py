"""What an adopter's own tests and evals use: a scripted model for their agent (`crashsafe.testing.scripted`)."""

from __future__ import annotations

from crashsafe.testing.scripted import (
    Call,
    ModelTurn,
    Say,
    Script,
    ToolResult,
    Transcript,
    respond,
    serve,
    step,
)

__all__ = ["Call", "ModelTurn", "Say", "Script", "ToolResult", "Transcript", "respond", "serve", "step"]
