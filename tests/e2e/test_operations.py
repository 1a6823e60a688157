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

from crashsafe.contracts.subjects import StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.nats_users import read_credential
from tests.support.stack import StackClient, auth_header, cli_env, crashsafe, guest_event
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
    """`crashsafe up --scale runtime=2` restarts a killed runtime and its own killed nats-server (same port, same
    store: a run submitted afterwards completes); `down` stops every process and stack.json says so."""
    state = tmp_path / "state"
    up = subprocess.Popen(
        [sys.executable, "-m", "crashsafe.cli", "up", "--state-dir", str(state), "--scale", "runtime=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        stack = await eventually(lambda: _stack_json(state), what=f"{state / 'stack.json'} to be written")
        assert stack["status"] == "running"
        assert stack["gateway_url"].startswith("http://127.0.0.1:") and stack["nats_url"].startswith(
            "nats://"
        )
        runtimes = [s for s in stack["services"] if s["service"] == "runtime"]
        assert [s["name"] for s in runtimes] == ["runtime-0", "runtime-1"]
        # NATS users on: one private credential per role; stack.json names the operator's, never a seed.
        creds = {p.stem: p for p in (state / "nats" / "creds").glob("*.creds")}
        assert {"gateway", "runtime", "executor-payment", "reconciler", "operator", "analytics"} <= set(creds)
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in creds.values())
        assert stack["operator_creds"] == str(creds["operator"])
        text = (state / "stack.json").read_text() + (state / "nats" / "nats-server.conf").read_text()
        assert not [p for p in creds.values() if read_credential(p).seed in text]
        assert len({s["pid"] for s in runtimes}) == 2 and all(_alive(s["pid"]) for s in runtimes)
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get(stack["gateway_url"] + "/readyz")).status_code == 200
            # The evidence console, where `up` says it is (stack.json and its output): its sign-in page.
            assert stack["console_url"] == stack["gateway_url"] + "/console/"
            signin = await http.get(stack["console_url"], follow_redirects=True)
            assert signin.status_code == 200 and 'name="key"' in signin.text
        runtime_pid = _pid_of(stack, "runtime-0")
        os.kill(runtime_pid, signal.SIGKILL)

        def restarted(name: str, pid: int) -> Callable[[], dict[str, Any] | None]:
            def check() -> dict[str, Any] | None:
                current = _stack_json(state)
                return current if current and _pid_of(current, name) != pid else None

            return check

        after = await eventually(
            restarted("runtime-0", runtime_pid), what="the supervisor to restart runtime-0", timeout_s=30
        )
        restarted_runtime = next(s for s in after["services"] if s["name"] == "runtime-0")
        assert restarted_runtime["restarts"] == 1
        # Each life binds a free ops port of its own; stack.json names the new one once it is bound.
        before = next(s for s in stack["services"] if s["name"] == "runtime-0")["ops_url"]

        def announced() -> str | None:
            current = _stack_json(state)
            entry = next(s for s in current["services"] if s["name"] == "runtime-0") if current else None
            return entry["ops_url"] if entry and entry["pid"] != runtime_pid and entry["ops_url"] else None

        ops_url = await eventually(announced, what="stack.json to name the restarted runtime's ops port")
        assert before and ops_url

        async def ops_ready() -> bool:
            async with httpx.AsyncClient(timeout=5) as http:
                try:
                    return (await http.get(f"{ops_url}/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

        await eventually(ops_ready, what="the restarted runtime ready on its ops port")

        nats_pid = _pid_of(after, "nats-server")
        os.kill(nats_pid, signal.SIGKILL)
        after = await eventually(
            restarted("nats-server", nats_pid), what="the supervisor to restart nats-server", timeout_s=30
        )
        assert after["nats_url"] == stack["nats_url"], "nats-server must come back on the same port"
        assert next(s for s in after["services"] if s["name"] == "nats-server")["restarts"] == 1
        # `up` minted an admin key for its own clients: the key alone on one line, readable by its owner only.
        key_file = state / "api_key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        api_key = key_file.read_text()
        assert api_key.endswith("\n") and api_key.count("\n") == 1 and api_key.startswith("csk_")
        assert api_key.strip() not in (state / "stack.json").read_text()
        assert await _book_and_finish(stack["gateway_url"], api_key.strip()) == "completed"

        down = await crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert await asyncio.to_thread(up.wait, 30) == 0
        final = _stack_json(state)
        assert final is not None and final["status"] == "stopped"
        for service in after["services"]:
            assert not _alive(int(service["pid"])), f"{service['name']} still running after down"
        again = await crashsafe("down", "--state-dir", str(state))
        assert again.returncode == 0 and "already stopped" in again.stdout
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


async def _book_and_finish(gateway_url: str, api_key: str) -> str:
    """Submit one booking as a careful client would (retrying the same key) and wait for its end."""
    body = guest_event(guest_id="guest-after-broker-kill")
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10, headers=auth_header(api_key)) as gateway:

        async def accepted() -> str | None:
            try:
                response = await gateway.post("/v1/events", json=body)
            except httpx.TransportError:
                return None
            return str(response.json()["run_id"]) if response.status_code == 202 else None

        run_id = await eventually(accepted, what="the gateway to accept a run", timeout_s=30, every_s=0.2)

        async def ended() -> str | None:
            try:
                response = await gateway.get(f"/v1/runs/{run_id}")
            except httpx.TransportError:
                return None
            status = response.json()["status"] if response.status_code == 200 else "running"
            return None if status == "running" else str(status)

        return await eventually(ended, what=f"run {run_id} to end", timeout_s=60)


async def test_one_guest_message_is_one_trace_and_the_cli_shows_it(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack()
    run_id = await client.submit(
        "Book a room in Paris from 2031-12-01 to 2031-12-02",
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
