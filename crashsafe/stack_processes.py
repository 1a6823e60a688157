"""One supervised process of a stack: who its pid is (not merely a number), its restart back-off, its record."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crashsafe.forkserver import ForkedService

# These bind one fixed port each (the URL in stack.json); replicas of them need a load balancer, not `--scale`.
SINGLE_PORT = ("sandbox", "gateway")


@dataclass(frozen=True)
class Backoff:
    """Restart delays. The first death, or one after a life of `stable_s` or more, is a crash: restart at once, as
    Kubernetes does. While the process keeps dying within `stable_s` of its start it is a crash loop: wait
    `base_s`, doubling each time up to `cap_s`."""

    base_s: float = 0.2
    cap_s: float = 10.0
    stable_s: float = 10.0

    def next(self, previous_s: float | None, uptime_s: float) -> float:
        if previous_s is None or uptime_s >= self.stable_s:
            return 0.0
        if not previous_s:
            return self.base_s
        return min(self.cap_s, previous_s * 2)


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a pid is: its start time (clock ticks since boot, /proc/<pid>/stat field 22) and command line.

    A pid alone is not an identity: once our process exits the kernel may hand its number to any other one.
    """

    pid: int
    start_ticks: int
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the live process `pid`, or None if there is none (or it is a zombie)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        # Field 2 (comm) may hold spaces and parentheses: split after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2 :].split()
        # An empty command line: a zombie, a kernel thread, or a process inside execve (its new arguments not yet
        # in place): not an identity to record or to match.
        if fields[0] == "Z" or not cmdline:
            return None
        return cls(pid, int(fields[19]), tuple(a.decode(errors="replace") for a in cmdline.split(b"\0") if a))

    @classmethod
    def settled(cls, pid: int, timeout_s: float = 2.0) -> ProcessIdentity | None:
        """The identity of a process just started: Popen returns while execve may still be setting it up."""
        deadline = time.monotonic() + timeout_s
        while (identity := cls.of(pid)) is None and time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                return None
            if stat[stat.rindex(")") + 2] == "Z":
                return None  # it already died: nothing to record
            time.sleep(0.005)
        return identity

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessIdentity | None:
        try:
            return cls(int(data["pid"]), int(data["start_ticks"]), tuple(str(a) for a in data["cmdline"]))
        except (KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool:
        """The very process recorded is still running (not merely some process with its pid)."""
        return ProcessIdentity.of(self.pid) == self

    def signal(self, sig: int) -> bool:
        """Send `sig` only if the pid is still this process; False if it is gone or is someone else now."""
        # A pidfd pins the process: checked after opening it, the identity cannot change before the signal.
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self.alive():
                return False
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
        return True


@dataclass
class Service:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Set for one life only (a crash point): cleared when the process dies, so the restart runs clean.
    once_env: dict[str, str] = field(default_factory=dict)
    # The `--scale` name this is a replica of (`executor-payment` for `executor-payment-2`).
    base: str = ""
    # The interpreter of another installation of crashsafe (a release's own venv) to serve it from, as a pod
    # runs its own image; None: the stack's (`Stack.python`).
    python: str | None = None
    process: subprocess.Popen[bytes] | ForkedService | None = None
    identity: ProcessIdentity | None = None
    restarts: int = 0
    stopped: bool = False
    started_at: float = 0.0
    delay_s: float | None = None  # the last restart delay, for the back-off
    restart_at: float | None = None  # when the supervisor restarts it (set once it saw it dead)
    # Where this life's log starts, and the ops URL it printed (`ops listening on …`), once read.
    log_offset: int = 0
    ops_url: str | None = None
