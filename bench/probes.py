"""What the bench reads about each process from outside it: peak RSS and CPU time from /proc, py-spy samples."""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the most resident memory the process ever had."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat(5)


def machine_cpu_seconds() -> float:
    """Busy CPU time of the whole machine, all cores (from /proc/stat): shows load the bench did not cause."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICKS  # guest time is already inside user


def nats_traffic(monitor_url: str) -> dict[str, tuple[int, int]]:
    """Messages each open NATS connection has sent to the server and received from it so far, by connection name
    (a service's replicas summed): from nats-server's `/connz`. Sent counts publishes and acks; received counts
    deliveries, PubAcks and replies."""
    with urllib.request.urlopen(f"{monitor_url}/connz?limit=4096", timeout=5) as answer:
        connections = json.load(answer).get("connections") or []
    traffic: dict[str, tuple[int, int]] = {}
    for c in connections:
        # A service names its connection `<service>-<worker id>`, and the worker id is `<hostname>-<pid>`.
        name = str(c.get("name") or "unnamed").split(f"-{socket.gethostname()}-")[0]
        sent, received = traffic.get(name, (0, 0))
        traffic[name] = (sent + int(c.get("in_msgs", 0)), received + int(c.get("out_msgs", 0)))
    return traffic


def py_spy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


PY_SPY_HINT = (
    f"--profile needs py-spy: `{sys.executable} -m pip install py-spy` (and root, or ptrace permission)"
)


@dataclass
class Recording:
    name: str
    path: Path
    process: subprocess.Popen[bytes]


class PySpy:
    """py-spy record on several processes at once, from start() until stop(); raw collapsed stacks per process."""

    def __init__(self, binary: str, out_dir: Path, rate: int = 100) -> None:
        self.binary = binary
        self.out_dir = out_dir
        self.rate = rate
        self.recordings: list[Recording] = []

    def start(self, label: str, pids: dict[str, int]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            path = self.out_dir / f"{label}-{name}.txt"
            args = [
                self.binary,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--full-filenames",
                "--rate",
                str(self.rate),
                "-o",
                str(path),
            ]
            process = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
            )
            self.recordings.append(Recording(name, path, process))

    def stop(self) -> list[Recording]:
        """SIGINT makes py-spy write what it sampled; returns the recordings that produced a file."""
        done, self.recordings = self.recordings, []
        for rec in done:
            if rec.process.poll() is None:
                rec.process.send_signal(signal.SIGINT)
        for rec in done:
            try:
                rec.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rec.process.kill()
                rec.process.wait()
        return [rec for rec in done if rec.path.exists()]


# Reading collapsed stacks ---------------------------------------------------------------------------------

# What a busy sample was doing, judged from the innermost frame that names a cost; first pattern wins per frame.
# Generic frames (handler code, the event loop) only count when nothing more specific is on the stack.
_COSTS = (
    ("tracing (OTel extract/inject)", r"context_from|headers_for|trace_id_of|opentelemetry/"),
    ("logging", r"services/platform/logs\.py|logging/"),
    ("journal read (direct get)", r"_direct_batch|read_subject|first_on_subject|last_on_each_subject"),
    ("sqlite (aiosqlite + thread hops)", r"aiosqlite/|sqlite3"),
    ("socket writes (send syscalls)", r"_SelectorSocketTransport\.write|writelines|_flusher"),
    (
        "nats-py publish/request",
        r"JetStreamContext\.publish|Client\.request|_request_new_style|PubAck|Client\.publish|_send_publish",
    ),
    (
        "nats-py receive",
        r"_read_loop|Parser\.parse|_process_msg|_wait_for_msgs|Msg\.metadata|Metadata\.|_process_headers",
    ),
    ("message ack", r"Msg\.(ack|nak|term|in_progress)"),
    ("deliveries (tasks, heartbeats)", r"Deliveries\.(dispatch|_heartbeat|_done)|on_message"),
    ("runtime core (fold, decide)", r"domain/"),
    ("openai SDK", r"openai/|pydantic"),
    ("HTTP client (httpx, httpcore, anyio)", r"httpx2?/|httpcore2?/|anyio/"),
    ("HTTP server (uvicorn, litestar)", r"uvicorn/|litestar/|httptools"),
    ("msgspec", r"msgspec"),
)
_GENERIC = (
    ("handler code (services, contracts)", r"services/|contracts/|bench/"),
    ("event loop, tasks", r"asyncio/|selectors"),
)
_COST_RX = [(name, re.compile(rx)) for name, rx in _COSTS]
_GENERIC_RX = [(name, re.compile(rx)) for name, rx in _GENERIC]


def _cost(frames: list[str]) -> str:
    """Innermost specific cost on the stack; h11 frames are skipped so parsing counts for its client or server."""
    frames = [f for f in frames if "/h11/" not in f] or frames
    for table in (_COST_RX, _GENERIC_RX):
        for frame in reversed(frames):
            for name, rx in table:
                if rx.search(frame):
                    return name
    return "other"


_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*?)(?::(?P<line>\d+))?\)$")
_PREFIXES = sorted({p.rstrip("/") + "/" for p in sys.path if p and p.startswith("/")}, key=len, reverse=True)

# py-spy drops threads the kernel reports asleep, but a thread parked in a C wait it re-enters between samples
# still shows up; these leaves are waits, not work.
_WAITS = (
    ("EpollSelector.select", ""),
    ("Condition.wait", ""),
    ("_connection_worker_thread", "tx.get("),  # aiosqlite's worker thread waiting for its next statement
    ("_worker", "work_queue.get("),  # an idle concurrent.futures thread (the loop's default executor)
)

# Frames every sample of a process passes through; as "inclusive" costs they say nothing.
_SCAFFOLD = re.compile(
    r"^(<module>|_run_module_as_main|_run_code|main|run|run_workload|Runner\.run"
    r"|BaseEventLoop\.(run_until_complete|run_forever|_run_once)|Handle\._run"
    r"|Thread\.(run|_bootstrap|_bootstrap_inner)|Server\.(serve|_serve|main_loop)) "
)


def _short(path: str) -> str:
    for prefix in _PREFIXES:
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def _parse(frame: str) -> tuple[str, str, int]:
    match = _FRAME.match(frame)
    if match is None:
        return frame, "", 0
    return match["func"], match["path"], int(match["line"] or 0)


def _is_wait(frame: str) -> bool:
    func, path, line = _parse(frame)
    return any(
        func == name and (not source or source in linecache.getline(path, line)) for name, source in _WAITS
    )


def _function(frame: str) -> str:
    """`handle (/x/site-packages/pkg/mod.py:42)` -> `handle (pkg/mod.py)`."""
    func, path, _ = _parse(frame)
    return f"{func} ({_short(path)})"


def _line(frame: str) -> str:
    func, path, line = _parse(frame)
    return f"{func} ({_short(path)}:{line})"


@dataclass(frozen=True)
class ProfileSummary:
    name: str
    samples: int
    by_cost: list[tuple[str, float]]  # share of busy samples by what they were doing
    top_self: list[tuple[str, float]]  # leaf frames, by line
    top_inclusive: list[tuple[str, float]]  # functions on the stack, counted once per sample


def summarise(name: str, path: Path, top: int = 12) -> ProfileSummary:
    """Collapsed stacks ("frame;frame;leaf count" per line, root first) to shares of busy samples."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    costs: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f.strip()]
        if not frames or not count_text.isdigit() or _is_wait(frames[-1]):
            continue
        count = int(count_text)
        total += count
        self_counts[_line(frames[-1])] += count
        costs[_cost([_function(f) for f in frames])] += count
        for function in {_function(f) for f in frames}:
            incl_counts[function] += count
    share = (lambda c: c / total) if total else (lambda c: 0.0)
    return ProfileSummary(
        name=name,
        samples=total,
        by_cost=[(k, share(v)) for k, v in costs.most_common()],
        top_self=[(k, share(v)) for k, v in self_counts.most_common(top)],
        top_inclusive=[(k, share(v)) for k, v in incl_counts.most_common() if not _SCAFFOLD.match(k)][:top],
    )


def profile_text(summary: ProfileSummary) -> str:
    lines = [f"== {summary.name}: {summary.samples} busy samples"]
    lines.append("   where the time goes:")
    lines += [f"     {v:6.1%}  {k}" for k, v in summary.by_cost if v >= 0.005]
    lines.append("   top self (leaf frames):")
    lines += [f"     {v:6.1%}  {k}" for k, v in summary.top_self]
    lines.append("   top inclusive:")
    lines += [f"     {v:6.1%}  {k}" for k, v in summary.top_inclusive]
    return "\n".join(lines)
