"""An adopter's crash test of their own agent in one command (issue 32, item 1): `crashsafe new agent desks`, its
stub provider, then `crashsafe crash-test` at two seams (the executor SIGKILLed after the provider committed, the
runtime after journaling an action it had not yet published). Each seam gets a fresh stack; the table says `ok` for
both, and the stub provider, counted by itself, holds one reservation and one charge per conversation (the run
without a crash and one per seam), each in its own stack's account. The package's own crash test, written by
`new agent` on `crashsafe.testing.real_stack`, passes too."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DAY = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
SEAMS = ("executor.after_provider_ack", "runtime.after_action_journaled")


async def _run(*args: str, cwd: Path, env: dict[str, str], timeout_s: float = 150.0) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, out.decode()


async def _new_agent(into: Path) -> None:
    code, out = await _run(
        "-m", "crashsafe.cli", "new", "agent", "desks", "--dir", str(into), cwd=ROOT, env={}
    )
    assert code == 0, out


async def test_crash_test_kills_a_new_agent_at_two_seams_and_its_provider_holds_each_effect_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    await _new_agent(app)
    monkeypatch.syspath_prepend(str(app))
    try:
        # The stub on a thread of this test, so the test counts what it holds by itself, not through crashsafe.
        provider = importlib.import_module("desks.provider")
        stub = provider.start()
        try:
            code, out = await _run(
                "-m",
                "crashsafe.cli",
                "crash-test",
                "--registry",
                "desks.registry:registry",
                "--providers",
                f"http://127.0.0.1:{stub.server_port}",
                "--model",
                "desks.model:script",
                "--say",
                f"A slot on {DAY}",
                *(arg for seam in SEAMS for arg in ("--seam", seam)),
                "--state-dir",
                str(tmp_path / "stacks"),
                cwd=app,
                env={"PYTHONPATH": str(ROOT), "COLUMNS": "200"},
            )
        finally:
            stub.shutdown()
            stub.server_close()
        reservations, charges = provider.written("reservations"), provider.written("charges")
    finally:  # imported here only: another test may write a package of that name again
        for module in [m for m in sys.modules if m == "desks" or m.startswith("desks.")]:
            del sys.modules[module]

    assert code == 0, out
    lines = out.splitlines()
    assert "no crash: ok" in lines, out
    assert "executor.after_provider_ack@executor-desks: ok" in lines, out
    assert "runtime.after_action_journaled@runtime: ok" in lines, out
    # Three conversations (none, each seam), each on its own stack as its own tenant: one of each effect per account.
    per_account = Counter(r["account"] for r in reservations), Counter(c["account"] for c in charges)
    assert len(per_account[0]) == 3 and set(per_account[0].values()) == {1}, reservations
    assert per_account[1] == per_account[0], charges
    assert {c["status"] for c in charges} == {"captured"}, charges


async def test_the_new_agents_own_crash_test_passes_on_a_real_stack(tmp_path: Path) -> None:
    await _new_agent(tmp_path)
    code, out = await _run(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-W",
        "error",
        "desks/tests/test_crash.py",
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert code == 0 and "1 passed" in out, out[-4000:]
