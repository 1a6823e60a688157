"""The operator's surface: `crashsafe up`/`down` supervising real processes, `runs show`, `audit`, and one trace per guest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from contracts.subjects import Namespace, StreamKind
from services.platform.jetstream import Broker
from crashsafe.stack import Stack
from tests.flows import submit, wait_terminal

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _crashsafe(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crashsafe.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _stack_json(state: Path, deadline_s: float = 60) -> dict:
    path = state / "stack.json"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"no {path}")


def _pid_of(stack: dict, name: str) -> int:
    return next(int(s["pid"]) for s in stack["services"] if s["name"] == name)


def test_up_supervises_and_down_stops(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = subprocess.Popen(
        [sys.executable, "-m", "crashsafe.cli", "up", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        stack = _stack_json(state)
        assert stack["gateway_url"].startswith("http://127.0.0.1:") and stack["nats_url"].startswith(
            "nats://"
        )
        assert httpx.get(stack["gateway_url"] + "/readyz", timeout=5).status_code == 200
        runtime_pid = _pid_of(stack, "runtime")
        os.kill(runtime_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            restarted = json.loads((state / "stack.json").read_text())
            if _pid_of(restarted, "runtime") != runtime_pid:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the supervisor did not restart the runtime")
        assert next(s for s in restarted["services"] if s["name"] == "runtime")["restarts"] == 1
        down = _crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert up.wait(timeout=30) == 0
        for service in restarted["services"]:
            try:
                os.kill(int(service["pid"]), 0)
                alive = True
            except ProcessLookupError:
                alive = False
            assert not alive, f"{service['name']} still running after down"
    finally:
        if up.poll() is None:
            up.kill()


async def test_one_guest_message_is_one_trace_and_the_cli_shows_it(
    make_stack, broker: Broker, namespace: Namespace
) -> None:
    stack: Stack = make_stack()
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as client:
        body = {
            "event_id": "evt-trace",
            "session_id": "s",
            "guest_id": "guest-trace",
            "text": "Book a room in Paris from 2026-12-01 to 2026-12-02",
        }
        response = await client.post(
            "/v1/events", json=body, headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
        )
        assert response.status_code == 202
        run_id = response.json()["run_id"]
    assert (await wait_terminal(stack, run_id))["status"] == "completed"

    stored = await broker.read_subject(namespace.stream(StreamKind.RUNS), namespace.run_events(run_id))
    assert len(stored) >= 10
    traces = {m.headers.get("traceparent", "").split("-")[1] for m in stored}
    assert traces == {TRACE_ID}, "every journal event, whichever service caused it, carries the guest's trace"

    env = {
        "CRASHSAFE_NATS_URL": stack.nats_url,
        "CRASHSAFE_NAMESPACE": namespace.name,
        "CRASHSAFE_SANDBOX_URL": stack.sandbox_url,
    }
    shown = _crashsafe("runs", "show", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout and "create_payment" in shown.stdout
    as_json = [
        json.loads(line) for line in _crashsafe("runs", "show", run_id, "--json", env=env).stdout.splitlines()
    ]
    assert as_json[0]["type"] == "run.started" and as_json[-1]["type"] == "run.completed"
    audit = _crashsafe("audit", env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "nothing wrong" in audit.stdout
    assert _crashsafe("runs", "show", "run_000000000000000000000000", env=env).returncode == 1


async def test_reconcile_cli_on_a_finished_run_asks_nothing(make_stack, namespace: Namespace) -> None:
    stack: Stack = make_stack(executors=("booking", "payment", "notify"))
    run_id = await submit(stack, text="hello there")
    assert (await wait_terminal(stack, run_id))["status"] == "completed"
    env = {"CRASHSAFE_NATS_URL": stack.nats_url, "CRASHSAFE_NAMESPACE": namespace.name}
    done = _crashsafe("reconcile", run_id, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{run_id}: completed; asked to resolve: nothing open" in done.stdout
    assert "no open runs" in _crashsafe("reconcile", env=env).stdout
