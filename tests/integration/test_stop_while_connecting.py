"""A service started while NATS is away stops on SIGTERM at once: the wait for NATS must not outlast Kubernetes'
termination grace period (it reconnected for ever, logging four lines a second, until SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashsafe.natsd import free_port


@pytest.mark.parametrize("service", ["reconciler", "gateway"])
def test_sigterm_while_waiting_for_nats_stops_the_service(tmp_path: Path, service: str) -> None:
    env = {
        **os.environ,
        "CRASHSAFE_NATS_URL": f"nats://127.0.0.1:{free_port()}",  # nobody listens there
        "CRASHSAFE_OPS_PORT": "0",
        "CRASHSAFE_GATEWAY_PORT": str(free_port()),
        "CRASHSAFE_DATA_DIR": str(tmp_path),
        # Every failed attempt is a line at DEBUG (at INFO an outage is one line), so the test can count them.
        "CRASHSAFE_LOG_LEVEL": "DEBUG",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "crashsafe.cli", "serve", service],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        for _ in range(8):  # a few failed attempts to reach NATS (4 a second): well into its reconnect loop
            process.stderr.readline()
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        process.wait(timeout=10)
        assert time.monotonic() - started < 5.0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
