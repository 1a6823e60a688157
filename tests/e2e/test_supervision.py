"""The supervisor as an operator relies on it: crash loops back off, replicas all serve, `down` spares strangers."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from crashsafe import cli, demo
from crashsafe.deployment import settings_for
from crashsafe.stack import Stack
from crashsafe.stack_plan import RegistryUnusable, ScaleError, parse_scale
from crashsafe.stack_processes import Backoff, ProcessIdentity
from crashsafe.stack_state import write_stack_json
from tests.support.stack import StackClient, crashsafe, supervised
from tests.support.waiting import eventually


def test_backoff_restarts_a_crash_at_once_doubles_for_a_crash_loop_and_resets_after_a_stable_life() -> None:
    policy = Backoff(base_s=0.2, cap_s=10.0, stable_s=10.0)
    delays: list[float] = []
    delay: float | None = None
    for _ in range(9):
        delay = policy.next(delay, uptime_s=0.5)
        delays.append(delay)
    assert delays == [0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    assert policy.next(10.0, uptime_s=10.0) == 0.0, "a process that stayed up a while starts afresh"
    assert policy.next(0.0, uptime_s=0.5) == 0.2


def test_scale_is_parsed_and_checked_against_the_stack(tmp_path: Path) -> None:
    assert parse_scale("executor-payment=3, runtime=2") == {"executor-payment": 3, "runtime": 2}
    for bad in ("runtime", "runtime=0", "runtime=x", "=2"):
        with pytest.raises(ScaleError):
            parse_scale(bad)
    with pytest.raises(ScaleError, match="no service executor-nope"):
        Stack(tmp_path, scale={"executor-nope": 2})
    with pytest.raises(ScaleError, match="gateway listens on one port"):
        Stack(tmp_path, scale={"gateway": 2})
    stack = Stack(tmp_path, scale={"executor-payment": 3, "runtime": 2})
    assert [s.name for s in stack.replicas("executor-payment")] == [
        "executor-payment-0",
        "executor-payment-1",
        "executor-payment-2",
    ]
    envs = [stack.env_for(s) for s in stack.replicas("executor-payment")]
    differing = {k for e in envs for k in e if any(e.get(k) != other.get(k) for other in envs)}
    assert differing == {"CRASHSAFE_WORKER_ID"}, "replicas start as a Deployment's pods: one environment"


def test_the_stack_starts_one_executor_per_tool_family_of_its_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adopter's registry gets its own families' executors, not the demo's four; one that cannot load is a
    typed error naming it, before anything starts."""
    executors = lambda stack: sorted(n for n in stack.services if n.startswith("executor-"))  # noqa: E731
    assert executors(Stack(tmp_path, registry="tests.support.misbehaving:registry")) == ["executor-noop"]
    monkeypatch.delenv("CRASHSAFE_REGISTRY", raising=False)
    assert executors(Stack(tmp_path)) == [
        "executor-booking",
        "executor-memory",
        "executor-notify",
        "executor-payment",
    ]
    monkeypatch.setenv("CRASHSAFE_REGISTRY", "tests.support.misbehaving:registry")
    assert executors(Stack(tmp_path)) == ["executor-noop"], "the registry the services will load"
    with pytest.raises(RegistryUnusable, match="no_such_registry_xyz"):
        Stack(tmp_path, registry="no_such_registry_xyz:registry")


def test_up_registry_runs_the_stack_under_it_and_operator_commands_follow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`crashsafe up --registry MOD:FN` reaches the Stack, which starts that registry's executors and writes it to
    stack.json, where `audit`, `replay` and the rest read it (no CRASHSAFE_REGISTRY needed beside the flag)."""
    monkeypatch.delenv("CRASHSAFE_REGISTRY", raising=False)
    spec = "tests.support.misbehaving:registry"
    given: dict[str, object] = {}

    async def run_up(state_dir: Path, *args: object, registry: str | None = None, **_: object) -> int:
        given.update(state_dir=state_dir, registry=registry)
        return 0

    monkeypatch.setattr(demo, "run_up", run_up)
    with pytest.raises(SystemExit) as exited:
        cli.main(["up", "--state-dir", str(tmp_path), "--registry", spec])
    assert exited.value.code == 0 and given == {"state_dir": tmp_path, "registry": spec}
    stack = Stack(tmp_path, registry=spec)
    assert sorted(n for n in stack.services if n.startswith("executor-")) == ["executor-noop"]
    assert stack.env_for(stack.services["runtime"])["CRASHSAFE_REGISTRY"] == spec
    write_stack_json(stack)
    written = json.loads((tmp_path / "stack.json").read_text())
    assert written["registry"] == spec
    written.pop("operator_creds")  # never started: no credential file was made
    (tmp_path / "stack.json").write_text(json.dumps(written))
    assert settings_for(tmp_path).registry == spec
    assert settings_for(tmp_path / "elsewhere").registry == "crashsafe.services.agents:stayhub"


async def test_a_crash_looping_service_backs_off(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(executors=(), backoff=Backoff(base_s=0.1, cap_s=0.8, stable_s=30.0))
    stack = client.stack
    looping = stack.services["reconciler"]
    looping.args = ["no-such-service"]  # every life from now on exits at once (argparse refuses it)
    stack.kill("reconciler")
    # For each restart: how long the supervisor left the dead process down, and the delay it chose. Lives are
    # interpreter starts, 0.2 s on a quiet machine and over a second on a loaded one, so the test measures the
    # wait between a death and the next life, never how many lives fit in a window.
    waits: list[tuple[float, float]] = []
    dead_since: float | None = None
    async with supervised(stack):
        end = time.monotonic() + 30.0
        while time.monotonic() < end and sum(1 for _, d in waits if d == 0.8) < 2:
            process = looping.process
            if dead_since is None and process is not None and process.poll() is not None:
                dead_since = time.monotonic()
            if looping.restarts > len(waits):
                assert dead_since is not None, "restarted a process that had not died"
                assert looping.delay_s is not None
                waits.append((time.monotonic() - dead_since, looping.delay_s))
                dead_since = None
            await asyncio.sleep(0.01)
    delays = [d for _, d in waits]
    assert delays[:5] == [0.0, 0.1, 0.2, 0.4, 0.8], f"at once, then doubling to the cap: {delays}"
    assert delays[-2:] == [0.8, 0.8], f"the delay holds at its cap: {delays}"
    short = [(round(w, 2), d) for w, d in waits if w < d - 0.05]
    assert not short, f"a crash-looping process came back before its delay was out (waited, delay): {short}"
    assert stack.services["runtime"].restarts == 0, "the others are untouched"


async def test_scaled_replicas_are_listed_and_each_one_serves(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(scale={"executor-payment": 2, "runtime": 2})
    stack = client.stack
    listed = json.loads((stack.state_dir / "stack.json").read_text())
    by_service: dict[str, list[int]] = {}
    for entry in listed["services"]:
        by_service.setdefault(entry["service"], []).append(entry["pid"])
    assert len(set(by_service["executor-payment"])) == 2 and len(set(by_service["runtime"])) == 2
    for base in ("executor-payment", "runtime"):
        for serving in stack.replicas(base):
            # Only this replica of its service is up: a booking that completes was served by it.
            others = [s for s in stack.replicas(base) if s is not serving]
            for other in others:
                stack.kill(other.name)
            run_id = await client.submit(guest_id=f"guest-{serving.name}")
            assert (await client.wait_terminal(run_id, timeout_s=60))["status"] == "completed", serving.name
            for other in others:
                await asyncio.to_thread(stack.restart, other.name)
    counts = await client.counts()
    assert counts["charge"] == 4 and counts["booking"] == 4, counts


async def test_down_signals_only_the_processes_it_started(tmp_path: Path) -> None:
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ours_id = await eventually(lambda: ProcessIdentity.of(ours.pid), what="our process to show in /proc")
        stranger_id = await eventually(lambda: ProcessIdentity.of(stranger.pid), what="the stranger")
        # What stack.json says of a pid whose process exited and whose number the kernel gave to another one:
        recycled = {**stranger_id.to_json(), "start_ticks": stranger_id.start_ticks - 1}
        state = {
            "status": "running",
            "supervisor_pid": 999_999_999,
            "supervisor": None,
            "services": [
                {"name": "runtime", "pid": ours.pid, "identity": ours_id.to_json()},
                {"name": "gateway", "pid": stranger.pid, "identity": recycled},
                {"name": "sandbox", "pid": stranger.pid, "identity": None},
            ],
        }
        (tmp_path / "stack.json").write_text(json.dumps(state))
        down = await crashsafe("down", "--state-dir", str(tmp_path))
        assert down.returncode == 0, down.stdout + down.stderr
        assert await asyncio.to_thread(ours.wait, 10) == -signal.SIGTERM
        assert stranger.poll() is None, "a pid that is not the process we started is never signalled"
        assert f"gateway: pid {stranger.pid} is not the process crashsafe started" in down.stdout
        assert json.loads((tmp_path / "stack.json").read_text())["status"] == "stopped"
    finally:
        for process in (ours, stranger):
            if process.poll() is None:
                process.kill()
                process.wait()


async def test_a_stack_without_the_fork_server_starts_fresh_interpreters_that_serve(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    """The fallback where there is no fork server (not Linux, or the server failed): each service a fresh
    `python -m crashsafe.cli serve …`, started, ready and killed as before."""
    client = await start_stack(executors=(), reconciler=False, projector=False, forking=False)
    runtime = client.stack.services["runtime"].process
    assert isinstance(runtime, subprocess.Popen), "a fresh interpreter, not a forked service"
    assert (await client.gateway.get("/readyz")).status_code == 200
    client.stack.kill("runtime")
    assert runtime.poll() == -signal.SIGKILL
