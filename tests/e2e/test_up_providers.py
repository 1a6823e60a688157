"""`crashsafe up --providers URL`: the stack without a sandbox of its own, its executors and projector talking to
providers someone else runs (here a sandbox this test starts on a free port, standing in for a staging provider)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from crashsafe.natsd import free_port
from tests.support.processes import stop
from tests.support.stack import auth_header, crashsafe, guest_event
from tests.support.waiting import eventually
from tests.support.world import CONFIRMED, Sandbox, projected


def _stack_json(state: Path) -> dict[str, Any] | None:
    path = state / "stack.json"
    return json.loads(path.read_text()) if path.exists() else None


async def test_up_with_providers_books_against_them_and_starts_no_sandbox(tmp_path: Path) -> None:
    port = free_port()
    providers_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CRASHSAFE_SANDBOX_PORT": str(port), "CRASHSAFE_DATA_DIR": str(tmp_path / "staging")}
    log = open(tmp_path / "staging.log", "wb")
    staging = subprocess.Popen(
        [sys.executable, "-m", "crashsafe.cli", "serve", "sandbox"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    state = tmp_path / "state"
    up: subprocess.Popen[bytes] | None = None
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            providers = Sandbox(http, providers_url)

            async def answering() -> dict[str, int] | None:
                try:
                    return await providers.counts()
                except httpx.TransportError:
                    return None

            await eventually(answering, what="the staging providers to answer")
            up = subprocess.Popen(
                [sys.executable, "-m", "crashsafe.cli", "up", "--state-dir", str(state)]
                + ["--providers", providers_url + "/"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            stack = await eventually(lambda: _stack_json(state), what="stack.json", timeout_s=90)
            assert stack["status"] == "running"
            # No sandbox process, and everything that talks to providers was told the URL it was given.
            names = {s["service"] for s in stack["services"]}
            assert "sandbox" not in names
            assert {"gateway", "runtime", "executor-booking", "executor-payment", "projector"} <= names
            assert stack["providers_url"] == stack["sandbox_url"] == providers_url

            api_key = (state / "api_key").read_text().strip()
            body = guest_event(guest_id="guest-on-staging")
            gateway = httpx.AsyncClient(
                base_url=stack["gateway_url"], timeout=10, headers=auth_header(api_key)
            )
            async with gateway:
                accepted = await gateway.post("/v1/events", json=body)
                assert accepted.status_code == 202, accepted.text
                run_id = accepted.json()["run_id"]

                async def ended() -> str | None:
                    response = await gateway.get(f"/v1/runs/{run_id}")  # 404 until its first event
                    status = response.json()["status"] if response.status_code == 200 else "running"
                    return None if status == "running" else str(status)

                assert await eventually(ended, what=f"run {run_id} to end", timeout_s=90) == "completed"
            # The booking's effects, and its projections (email, CRM), are in the staging providers' books.
            await projected(lambda: providers.counts("guest-on-staging"), CONFIRMED)

        down = await crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert await asyncio.to_thread(up.wait, 30) == 0
        assert staging.poll() is None, "stopping the stack stopped providers it did not start"
    finally:
        if up is not None:
            stop(up)
        stop(staging)


async def test_up_refuses_a_providers_value_that_is_no_url(tmp_path: Path) -> None:
    done = await crashsafe("up", "--state-dir", str(tmp_path), "--providers", "staging:8090")
    assert done.returncode == 2
    assert "--providers wants an http(s):// base URL" in done.stderr
    assert not (tmp_path / "stack.json").exists()
