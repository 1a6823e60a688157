"""What an adopter's own tests and evals use: a scripted model for their agent (`scripted`; on HTTP, `python -m
crashsafe.testing MODULE:FUNCTION`, `model_server`)."""

from __future__ import annotations

from crashsafe.testing.scripted import (
    Call,
    ModelTurn,
    Say,
    Script,
    ToolResult,
    Transcript,
    respond,
    step,
)

__all__ = ["Call", "ModelTurn", "Say", "Script", "ToolResult", "Transcript", "respond", "step"]
