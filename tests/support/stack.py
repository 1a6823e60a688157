"""A whole stack of real processes, and the client that drives it as a guest and an operator would.

`open_stack` is the one way a test starts a stack (the `start_stack` fixture in conftest.py and the shared
module-scoped stacks both go through it); `StackClient` is the one way a test talks to it over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.settings import NatsAccess
from crashsafe.stack import Stack
from crashsafe.stack_keys import STACK_TENANT
from tests.support import capabilities
from tests.support.nats_users import creds_dir
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, Sandbox


def guest_event(
    event_id: str | None = None,
    *,
    guest_id: str = "guest-1",
    text: str = BOOKING_TEXT,
    session_id: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The JSON body of `POST /v1/events`: one guest message (extra fields go in as they are, to test refusals)."""
    event_id = event_id or f"evt-{uuid.uuid4().hex[:12]}"
    return {
        "event_id": event_id,
        "session_id": session_id or f"s-{event_id}",
        "guest_id": guest_id,
        "text": text,
        **overrides,
    }


def auth_header(api_key: str) -> dict[str, str]:
    """What a client of the gateway sends with every request."""
    return {"authorization": f"Bearer {api_key}"}


class StackClient:
    """The gateway and the sandbox of one stack, over HTTP; `stack` is the processes themselves."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.ns = Namespace(stack.namespace)
        self.http = httpx.AsyncClient(timeout=20.0)
        # The stack's own admin key (tenant `demo`), as every client of the gateway must send one.
        self.api_key = stack.api_key
        self.tenant = STACK_TENANT
        self.gateway = httpx.AsyncClient(
            base_url=stack.gateway_url, timeout=20.0, headers=auth_header(stack.api_key)
        )
        # A manager's client: the stack's approver key (approvals:decide, runs:read), since the admin key that
        # starts the stack's runs never decides their approvals.
        self.approver_key = stack.approver_key
        self.manager = httpx.AsyncClient(
            base_url=stack.gateway_url, timeout=20.0, headers=auth_header(stack.approver_key)
        )
        self.sandbox = Sandbox(self.http, stack.sandbox_url)

    async def aclose(self) -> None:
        await self.gateway.aclose()
        await self.manager.aclose()
        await self.http.aclose()

    # The guest ---------------------------------------------------------------------------------------------

    async def post_event(
        self,
        event_id: str,
        guest_id: str,
        text: str = BOOKING_TEXT,
        agent: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One `POST /v1/events`, answered as it is (the test judges the status)."""
        params = {"agent": agent} if agent else None
        body = guest_event(event_id, guest_id=guest_id, text=text)
        return await self.gateway.post("/v1/events", json=body, params=params, headers=headers)

    async def submit(
        self,
        text: str = BOOKING_TEXT,
        guest_id: str | None = None,
        key: str | None = None,
        agent: str | None = None,
        headers: dict[str, str] | None = None,
        deadline_s: float = 60.0,
    ) -> str:
        """Submit like a careful client: a dropped connection or a 503 is retried with the same key. The run id."""
        event_id, guest_id = key or unique("ev"), guest_id or unique("g")
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                response = await self.post_event(event_id, guest_id, text, agent, headers)
                if response.status_code == 202:
                    return str(response.json()["run_id"])
                if response.status_code != 503:
                    raise AssertionError(f"gateway answered {response.status_code}: {response.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway never accepted event {event_id} in {deadline_s}s")
            await asyncio.sleep(0.2)  # a client's back-off between retries, not synchronisation

    async def start_run(
        self, guest_id: str | None = None, text: str = BOOKING_TEXT, agent: str | None = None
    ) -> tuple[str, str]:
        """Submit a fresh guest event; returns (run_id, guest_id)."""
        guest_id = guest_id or unique("g")
        return await self.submit(text, guest_id, agent=agent), guest_id

    # The operator ------------------------------------------------------------------------------------------

    async def summary(self, run_id: str) -> dict[str, Any] | None:
        """`GET /v1/runs/{id}`; None for a run the gateway does not know."""
        response = await self.gateway.get(f"/v1/runs/{run_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    async def _peek(self, run_id: str) -> dict[str, Any] | None:
        """The summary if the gateway can give one right now (it may be restarting, or its broker down)."""
        try:
            response = await self.gateway.get(f"/v1/runs/{run_id}")
        except httpx.TransportError:
            return None
        return dict(response.json()) if response.status_code == 200 else None

    async def wait_status(self, run_id: str, status: str, timeout_s: float = 60.0) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            summary = await self._peek(run_id)
            return summary if summary is not None and summary["status"] == status else None

        return await eventually(reached, what=f"run {run_id} to be {status}", timeout_s=timeout_s)

    async def wait_terminal(self, run_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
        """The run's summary once it completed or was handed off."""

        async def ended() -> dict[str, Any] | None:
            summary = await self._peek(run_id)
            return summary if summary is not None and summary["status"] != "running" else None

        return await eventually(
            ended, what=f"run {run_id} to end (logs in {self.stack.logs_dir})", timeout_s=timeout_s
        )

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's journal as `GET /v1/runs/{id}/events` serves it (each event with its stream `seq`)."""
        response = await self.gateway.get(f"/v1/runs/{run_id}/events")
        response.raise_for_status()
        return list(response.json()["events"])

    async def requested(self, run_id: str, tool: str) -> dict[str, Any] | None:
        """The run's journaled request for `tool`, once there is one (for `eventually`)."""
        response = await self.gateway.get(f"/v1/runs/{run_id}/events")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        found = [
            e for e in response.json()["events"] if e["type"] == "run.action_requested" and e["tool"] == tool
        ]
        return dict(found[0]) if found else None

    async def reconcile(self, run_id: str) -> httpx.Response:
        return await self.gateway.post(f"/v1/runs/{run_id}/reconcile")

    # The sandbox (the outside world) -----------------------------------------------------------------------

    async def ledger(self, guest_id: str | None = None) -> dict[str, Any]:
        return await self.sandbox.ledger(guest_id)

    async def counts(self, guest_id: str | None = None) -> dict[str, int]:
        return await self.sandbox.counts(guest_id)

    async def arm(self, target: str, **fault: int) -> None:
        await self.sandbox.arm(target, **fault)

    async def faults(self) -> dict[str, Any]:
        return await self.sandbox.faults()

    async def clear_faults(self) -> None:
        await self.sandbox.clear_faults()


@asynccontextmanager
async def open_stack(
    state_dir: Path, *, nats_url: str | None, namespace: str | None = None, **kwargs: Any
) -> AsyncIterator[StackClient]:
    """Start a stack of real processes (nats-server too when `nats_url` is None) and stop it afterwards.

    Starting waits on every service's readiness, so it runs in a thread and the test's event loop keeps going.
    Without a namespace the stack gets its own, so tests sharing a nats-server never see each other's messages.
    """
    if nats_url:  # a server the test started: its users' credentials, one per service role
        kwargs.setdefault("nats_creds_dir", creds_dir(nats_url))
    stack = Stack(state_dir, nats_url=nats_url, namespace=namespace or f"t{uuid.uuid4().hex[:10]}", **kwargs)
    capabilities.install(stack.capability_key)  # the stack signs with the key the tests sign with
    try:
        await asyncio.to_thread(stack.start)
    except BaseException:
        await asyncio.to_thread(stack.stop)
        raise
    client = StackClient(stack)
    try:
        yield client
    finally:
        await client.aclose()
        await asyncio.to_thread(stack.stop)


@asynccontextmanager
async def supervised(stack: Stack) -> AsyncIterator[Stack]:
    """Restart whatever dies while the block runs, as Kubernetes restarts a crashed pod."""
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        yield stack
    finally:
        stop.set()
        await supervisor


# The operator's CLI -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def operator_access(stack: Stack) -> NatsAccess:
    """How a test connects to a stack's NATS as the operator (to read consumer state, inject, inspect)."""
    return NatsAccess(creds=stack.creds_for("operator"))


def cli_env(stack: Stack, *, sandbox: bool = True) -> dict[str, str]:
    """What points `crashsafe …` at this stack."""
    env = {"CRASHSAFE_NATS_URL": stack.nats_url, "CRASHSAFE_NAMESPACE": stack.namespace}
    operator = stack.creds_for("operator")
    if operator is not None:
        env["CRASHSAFE_NATS_CREDS"] = str(operator)
    if sandbox:
        env["CRASHSAFE_SANDBOX_URL"] = stack.sandbox_url
    return env


async def crashsafe(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> CliResult:
    """Run `crashsafe ARGS…` as an operator would, in its own process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crashsafe.cli",
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return CliResult(process.returncode or 0, out.decode(), err.decode())
