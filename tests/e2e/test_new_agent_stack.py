"""`crashsafe new agent desks`, then what it prints, typed in the folder it was written in: the package's stub
provider, its scripted model (`python -m crashsafe.testing desks.model:script`) and `crashsafe up --registry
desks.registry:registry` through the console script (whose path holds not the adopter's folder). The stack starts an
executor for the package's own tool family, and a guest's run goes through its read, its keyed write and its charge
against the stub provider, the charge in the provider's books under the key the runtime journaled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from crashsafe.natsd import free_port
from tests.support.paths import ROOT
from tests.support.processes import stop
from tests.support.stack import auth_header, crashsafe, guest_event
from tests.support.waiting import eventually

DAY = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
# What `pip install` puts in bin/crashsafe: run as a file, so its folder (not the adopter's) is first on the path.
CONSOLE_SCRIPT = "import sys\nfrom crashsafe.cli import main\nsys.argv[0] = 'crashsafe'\nsys.exit(main())\n"


def _serve(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def test_a_new_agent_runs_under_up_registry_on_the_first_try(tmp_path: Path) -> None:
    app, state = tmp_path / "app", tmp_path / "state"
    app.mkdir()
    made = await crashsafe("new", "agent", "desks", "--dir", str(app))
    assert made.returncode == 0, made.stderr
    script = tmp_path / "bin" / "crashsafe"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port, model_port = free_port(), free_port()
    provider_url, model_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{model_port}/v1"
    provider = _serve(["desks.provider", "--port", str(port)], app, env, tmp_path / "provider.log")
    model = _serve(
        ["crashsafe.testing", "desks.model:script", "--port", str(model_port)],
        app,
        env,
        tmp_path / "model.log",
    )
    up: subprocess.Popen[bytes] | None = None
    try:
        async with httpx.AsyncClient(timeout=5) as http:

            async def answering() -> bool | None:
                try:
                    slots = await http.get(f"{provider_url}/slots", params={"day": DAY})
                    asked = await http.post(f"{model_url}/responses", json={"input": f"A slot on {DAY}"})
                except httpx.TransportError:
                    return None
                return (slots.is_success and asked.is_success) or None

            await eventually(answering, what="the stub provider and the scripted model to answer")
        with open(tmp_path / "up.log", "wb") as log:
            up = subprocess.Popen(
                [sys.executable, str(script), "up", "--state-dir", str(state)]
                + ["--registry", "desks.registry:registry", "--providers", provider_url]
                + ["--model-url", model_url],
                cwd=app,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

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
                "/v1/events", json=guest_event(guest_id="guest-desks", text=f"A slot on {DAY}")
            )
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]

            async def ended() -> dict[str, Any] | None:
                response = await gateway.get(f"/v1/runs/{run_id}")
                summary = response.json() if response.status_code == 200 else {"status": "running"}
                return None if summary["status"] == "running" else dict(summary)

            summary = await eventually(ended, what=f"run {run_id} to end", timeout_s=90)
            assert summary["status"] == "completed", summary
            assert summary["reply"].startswith("Reserved and paid: rsv_"), summary
            events = (await gateway.get(f"/v1/runs/{run_id}/events")).json()["events"]
        requested = [e for e in events if e["type"] == "run.action_requested"]
        assert [e["tool"] for e in requested] == ["find_slots", "reserve_slot", "charge_reservation"]
        charge = requested[-1]
        assert charge["args"]["amount_cents"] == 4_500 and charge["key"].startswith("charge:")
        # The charge is in the provider's books under the key the runtime journaled, in the tenant's own account
        # (asked in another account, the key is unknown there).
        account = charge["args"]["account"]
        async with httpx.AsyncClient(timeout=5) as http:
            held = await http.get(
                f"{provider_url}/charges/by-key/{charge['key']}", headers={"Provider-Account": account}
            )
            elsewhere = await http.get(f"{provider_url}/charges/by-key/{charge['key']}")
        assert held.status_code == 200 and held.json()["status"] == "captured", held.text
        assert elsewhere.status_code == 404, elsewhere.text
        down = await crashsafe("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        if up is not None:
            stop(up)
        stop(provider)
        stop(model)
