"""`crashsafe new agent desks`, then `crashsafe up --registry desks.registry:registry` from the folder it was written
in, as an adopter types it (the console script, whose path holds not their folder): the stack starts an executor
for the package's own tool family, and a guest's run goes through its read, its keyed write and its charge against
the package's stub provider, with a model of the test's own that knows the package's tools."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from crashsafe.natsd import free_port
from tests.support.paths import ROOT
from tests.support.stack import auth_header, crashsafe, guest_event
from tests.support.waiting import eventually

DAY = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
# What `pip install` puts in bin/crashsafe: run as a file, so its folder (not the adopter's) is first on the path.
CONSOLE_SCRIPT = "import sys\nfrom crashsafe.cli import main\nsys.argv[0] = 'crashsafe'\nsys.exit(main())\n"


def _answer(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API answer: find a slot, reserve the first, charge it, then say so."""
    outputs = [json.loads(i["output"]) for i in items if i.get("type") == "function_call_output"]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("find_slots", {"day": DAY}),
        ("reserve_slot", {"slot_id": (outputs[0]["slots"][0]["slot_id"] if outputs else ""), "day": DAY}),
        ("charge_reservation", {"reservation_id": outputs[1]["reservation_id"] if len(outputs) > 1 else ""}),
    ]
    if len(outputs) < len(calls):
        name, args = calls[len(outputs)]
        output: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{len(outputs)}",
            "call_id": f"call_{len(outputs)}",
            "name": name,
            "arguments": json.dumps(args),
            "status": "completed",
        }
    else:
        text = f"Reserved and paid: {outputs[-1].get('charge_id')}"
        output = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    return {
        "id": f"resp_{len(outputs)}",
        "object": "response",
        "created_at": 0,
        "model": "test-model",
        "status": "completed",
        "output": [output],
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


class _Model(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        items = (
            body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        )
        data = json.dumps(_answer(items)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _model() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_a_new_agent_runs_under_up_registry_on_the_first_try(tmp_path: Path) -> None:
    app, state = tmp_path / "app", tmp_path / "state"
    app.mkdir()
    made = await crashsafe("new", "agent", "desks", "--dir", str(app))
    assert made.returncode == 0, made.stderr
    script = tmp_path / "bin" / "crashsafe"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port = free_port()
    provider_url = f"http://127.0.0.1:{port}"
    provider = subprocess.Popen(
        [sys.executable, "-m", "desks.provider", "--port", str(port)],
        cwd=app,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    up: subprocess.Popen[bytes] | None = None
    try:
        with _model() as model_url:
            async with httpx.AsyncClient(timeout=5) as http:

                async def answering() -> bool | None:
                    try:
                        return (
                            await http.get(f"{provider_url}/slots", params={"day": DAY})
                        ).is_success or None
                    except httpx.TransportError:
                        return None

                await eventually(answering, what="the stub provider to answer")
            log = open(tmp_path / "up.log", "wb")
            up = subprocess.Popen(
                [sys.executable, str(script), "up", "--state-dir", str(state)]
                + ["--registry", "desks.registry:registry", "--providers", provider_url],
                cwd=app,
                env={**env, "OPENAI_BASE_URL": model_url},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()

            def running() -> dict[str, Any] | None:
                assert up is not None and up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
                path = state / "stack.json"
                stack = json.loads(path.read_text()) if path.exists() else None
                return stack if stack and stack["status"] == "running" else None

            stack = await eventually(running, what="the stack to run", timeout_s=120)
            assert stack["registry"] == "desks.registry:registry"
            names = {s["service"] for s in stack["services"]}
            assert {"gateway", "runtime", "executor-desks"} <= names and "executor-booking" not in names

            api_key = (state / "api_key").read_text().strip()
            async with httpx.AsyncClient(
                base_url=stack["gateway_url"], timeout=10, headers=auth_header(api_key)
            ) as gateway:
                accepted = await gateway.post(
                    "/v1/events", json=guest_event(guest_id="guest-desks", text=f"A desk on {DAY}")
                )
                assert accepted.status_code == 202, accepted.text
                run_id = accepted.json()["run_id"]

                async def ended() -> dict[str, Any] | None:
                    response = await gateway.get(f"/v1/runs/{run_id}")
                    summary = response.json() if response.status_code == 200 else {"status": "running"}
                    return None if summary["status"] == "running" else dict(summary)

                summary = await eventually(ended, what=f"run {run_id} to end", timeout_s=90)
                assert summary["status"] == "completed", summary
                events = (await gateway.get(f"/v1/runs/{run_id}/events")).json()["events"]
            requested = [e for e in events if e["type"] == "run.action_requested"]
            assert [e["tool"] for e in requested] == ["find_slots", "reserve_slot", "charge_reservation"]
            charge = requested[-1]
            assert charge["args"]["amount_cents"] == 4_500 and charge["key"].startswith("charge:")
            # The charge is in the provider's books under the key the runtime journaled.
            async with httpx.AsyncClient(timeout=5) as http:
                held = await http.get(f"{provider_url}/charges/by-key/{charge['key']}")
            assert held.status_code == 200 and held.json()["status"] == "captured", held.text
        down = await crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        if up is not None:
            _stop(up)
        _stop(provider)
