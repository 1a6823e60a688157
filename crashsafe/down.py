"""`crashsafe down`: stop the stack `up` started, and only it (every pid checked against the identity `up`
recorded). Beside the process launcher (crashsafe/stack.py), not among the operator tasks: it acts on this
machine's processes, not on a deployment's NATS."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from crashsafe.deployment import stack_file
from crashsafe.stack import ProcessIdentity


def down(state_dir: Path, timeout_s: float = 30.0) -> int:
    """Stop the stack `up` started: its supervisor first, then anything of ours still alive; never a stranger.

    Every pid is checked against the identity `up` recorded (start time and command line): a pid the kernel
    has since given to another process is left alone.
    """
    stack = stack_file(state_dir)
    if not stack:
        print(f"no stack recorded in {state_dir}/stack.json")
        return 1
    if stack.get("status") == "stopped":
        print(f"the stack in {state_dir} is already stopped")
        return 0
    supervisor = ProcessIdentity.from_json(_mapping(stack.get("supervisor")))
    if supervisor is not None and supervisor.signal(signal.SIGTERM):
        print(f"asked the supervisor (pid {supervisor.pid}) to stop the stack")
        _wait_gone([supervisor], timeout_s)
        stack = stack_file(state_dir) or stack
    else:
        print(f"supervisor {stack.get('supervisor_pid')} is not running; stopping what it recorded")
    ours: list[ProcessIdentity] = []
    services = stack.get("services")
    for entry in services if isinstance(services, list) else []:
        identity = ProcessIdentity.from_json(_mapping(entry.get("identity")))
        if identity is not None and identity.signal(signal.SIGTERM):
            ours.append(identity)
        elif entry.get("pid") and _pid_exists(int(entry["pid"])):
            print(f"{entry.get('name')}: pid {entry['pid']} is not the process crashsafe started; left alone")
    for identity in _wait_gone(ours, timeout_s=10):
        identity.signal(signal.SIGKILL)
    if stack.get("status") != "stopped":
        _write_stack_file(state_dir, {**stack, "status": "stopped"})
    print("stack stopped")
    return 0


def _mapping(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def _pid_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _wait_gone(processes: list[ProcessIdentity], timeout_s: float) -> list[ProcessIdentity]:
    """Wait for these processes to exit; the ones still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in processes if p.alive()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _write_stack_file(state_dir: Path, state: dict[str, object]) -> None:
    tmp = state_dir / "stack.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / "stack.json")
