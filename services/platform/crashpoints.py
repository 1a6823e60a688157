"""Named seams where a process can be told to SIGKILL itself, so tests and the demo reach the worst moments."""

from __future__ import annotations

import os
import signal
import sys

ENV = "CRASHSAFE_CRASH_AT"

# Every seam a test or `crashsafe demo --crash` may name; docs/failure-modes.md says what happens at each.
SEAMS = (
    "executor.after_intent",
    "executor.after_provider_ack",
    "executor.after_receipt",
    "executor.after_outcome_published",
    "runtime.after_model_answer",
    "runtime.after_action_journaled",
    "runtime.after_outcome_received",
    "gateway.after_publish",
    "reconciler.mid_resolution",
)


def crash_point(seam: str) -> None:
    """Die here, now, with no cleanup, if this process was started with CRASHSAFE_CRASH_AT=<seam>."""
    if os.environ.get(ENV) == seam:
        sys.stderr.write(f"crashpoint {seam}: SIGKILL self (pid {os.getpid()})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
