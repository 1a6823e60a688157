"""Processes a test started itself (an `up`, a provider, a model): stopped as an operator would, then for sure."""

from __future__ import annotations

import signal
import subprocess


def stop(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM, and SIGKILL if it has not ended within `grace_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
