"""The operator's surface: `crashsafe up`/`down` supervising real processes, `runs show`, `audit`, and one trace per guest."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from contracts.subjects import StreamKind
from services.platform.jetstream import Broker
from tests.support.stack import StackClient, cli_env, crashsafe
from tests.support.waiting import eventually

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _stack_json(state: Path) -> dict[str, Any] | None:
    path = state / "stack.json"
    return json.loads(path.read_text()) if path.exists() else None


def _pid_of(stack: dict[str, Any], name: str) -> int:
    return next(int(s["pid"]) for s in stack["services"] if s["name"] == name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_up_supervises_and_down_stops(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = subprocess.Popen(
        [sys.executable, "-m", "crashsafe.cli", "up", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        stack = await eventually(lambda: _stack_json(state), what=f"{state / 'stack.json'} to be written")
        assert stack["gateway_url"].startswith("http://127.0.0.1:") and stack["nats_url"].startswith(
            "nats://"
        )
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get(stack["gateway_url"] + "/readyz")).status_code == 200
        runtime_pid = _pid_of(stack, "runtime")
        os.kill(runtime_pid, signal.SIGKILL)

        def restarted_runtime() -> dict[str, Any] | None:
            current = _stack_json(state)
            return current if current and _pid_of(current, "runtime") != runtime_pid else None

        restarted = await eventually(
            restarted_runtime, what="the supervisor to restart the runtime", timeout_s=30
        )
        assert next(s for s in restarted["services"] if s["name"] == "runtime")["restarts"] == 1
        down = await crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert await asyncio.to_thread(up.wait, 30) == 0
        for service in restarted["services"]:
            assert not _alive(int(service["pid"])), f"{service['name']} still running after down"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


async def test_one_guest_message_is_one_trace_and_the_cli_shows_it(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack()
    run_id = await client.submit(
        "Book a room in Paris from 2026-12-01 to 2026-12-02",
        guest_id="guest-trace",
        key="evt-trace",
        headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
    )
    assert (await client.wait_terminal(run_id))["status"] == "completed"

    ns = client.ns
    stored = await broker.read_subject(ns.stream(StreamKind.RUNS), ns.run_events(run_id))
    assert len(stored) >= 10
    traces = {m.headers.get("traceparent", "").split("-")[1] for m in stored}
    assert traces == {TRACE_ID}, "every journal event, whichever service caused it, carries the guest's trace"

    env = cli_env(client.stack)
    shown = await crashsafe("runs", "show", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout and "create_payment" in shown.stdout
    as_json = [
        json.loads(line)
        for line in (await crashsafe("runs", "show", run_id, "--json", env=env)).stdout.splitlines()
    ]
    assert as_json[0]["type"] == "run.started" and as_json[-1]["type"] == "run.completed"
    audit = await crashsafe("audit", env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "nothing wrong" in audit.stdout
    assert (await crashsafe("runs", "show", "run_000000000000000000000000", env=env)).returncode == 1


async def test_reconcile_cli_on_a_finished_run_asks_nothing(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(executors=("booking", "payment", "notify"))
    run_id = await client.submit(text="hello there")
    assert (await client.wait_terminal(run_id))["status"] == "completed"
    env = cli_env(client.stack, sandbox=False)
    done = await crashsafe("reconcile", run_id, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{run_id}: completed; asked to resolve: nothing open" in done.stdout
    assert "no open runs" in (await crashsafe("reconcile", env=env)).stdout
