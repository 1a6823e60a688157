"""Named seams where a process can be told to SIGKILL itself, so tests and the demo reach the worst moments."""

from __future__ import annotations

import logging
import os
import signal
import sys

# Every seam a test or `crashsafe demo --crash` may name; docs/failure-modes.md says what happens at each.
SEAMS = (
    "executor.after_intent",
    "executor.after_provider_ack",
    "executor.after_receipt",
    "executor.after_outcome_published",
    "runtime.after_model_answer",
    "runtime.after_action_journaled",
    "runtime.after_outcome_received",
    "runtime.after_turn_journaled",
    "gateway.after_approval_decided",
    "gateway.after_publish",
    "reconciler.mid_resolution",
    "projector.after_provider_call",
    "projector.before_ack",
    "projector.after_plan_publish",
)


_armed: str | None = None


def arm(seam: str | None) -> None:
    """Called once by a service's composition root with `Settings.crash_at` (CRASHSAFE_CRASH_AT)."""
    global _armed
    if seam is not None and seam not in SEAMS:
        raise ValueError(f"CRASHSAFE_CRASH_AT={seam!r} is not a seam; seams: {', '.join(SEAMS)}")
    _armed = seam


def crash_point(seam: str) -> None:
    """Die here, now, with no cleanup, if this process was armed at `seam`."""
    if _armed == seam:
        # A log line like every other (JSON once the service configured its logs); the handler flushes it.
        logging.getLogger("crashsafe.crashpoints").critical(
            f"crashpoint {seam}: SIGKILL self (pid {os.getpid()})", extra={"fields": {"seam": seam}}
        )
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
