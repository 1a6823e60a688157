"""A real stack for an adopter's end-to-end test (`crashsafe.testing.real_stack`): their registry on every service,
a seam armed to SIGKILL one process, the supervisor restarting it, and every keyed effect asked about afterwards by
its key, through its own operation's lookup. Built on `crashsafe.stack`, as `crashsafe up` is."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from crashsafe.contracts.clients import Scope
from crashsafe.crash_targets import CrashAt, crash_map, parse_crash
from crashsafe.stack import Stack
from crashsafe.stack_keys import mint_stack_key
from crashsafe.stack_plan import registry_families
from crashsafe.testing.scripted import Script

# A run's statuses once it ended (`GET /v1/runs/{id}`): it asks nothing more of anyone.
ENDED = ("completed", "handed_off")
# Where a message of a conversation starts, or is handed to a run: its event id is in the event.
_ARRIVED = ("run.started", "run.turn_received")
_POLL_S = 0.1
_TEST_KEY_FILE = "test_key"


@dataclass(frozen=True, slots=True)
class EffectAudit:
    """The stack's journals against its providers, as `crashsafe audit` judges them: each keyed write asked about by
    its key through its own operation's lookup (and, where a provider lists its effects, each effect it holds)."""

    findings: tuple[str, ...]
    keyed: int  # keyed writes the journals hold
    looked_up: (
        int  # of them, answered "found" or "absent" by their provider; the rest answered nothing to trust
    )

    @property
    def ok(self) -> bool:
        """Nothing wrong, and every keyed write judged: its provider holds what its run journaled, once."""
        return not self.findings and self.looked_up == self.keyed


class LiveStack:
    """A running stack as a guest and an operator use it: the gateway's HTTP API with an admin key of the stack's
    tenant; `stack` is the processes themselves (`crashsafe.stack.Stack`), for what this does not say."""

    def __init__(
        self, stack: Stack, registry: str, api_key: str, tenant: str, crashes: Sequence[CrashAt]
    ) -> None:
        self.stack = stack
        self.registry = registry
        self.tenant = tenant
        self.crashes = tuple(crashes)
        self.gateway = httpx.AsyncClient(
            base_url=stack.gateway_url, timeout=20.0, headers={"authorization": f"Bearer {api_key}"}
        )

    @property
    def logs_dir(self) -> Path:
        return self.stack.logs_dir

    async def aclose(self) -> None:
        await self.gateway.aclose()

    # The guest -------------------------------------------------------------------------------------------------

    async def send(
        self,
        text: str,
        *,
        guest_id: str = "guest-1",
        session_id: str | None = None,
        event_id: str | None = None,
        agent: str | None = None,
        deadline_s: float = 60.0,
    ) -> dict[str, Any]:
        """`POST /v1/events` as a careful client: a dropped connection or a 503 (the gateway killed, restarting) is
        sent again with the same event id, which the gateway answers once. The 202's body (`run_id`, `turn`)."""
        event_id = event_id or f"ev-{uuid.uuid4().hex[:12]}"
        body = {"event_id": event_id, "session_id": session_id or f"s-{event_id}", "guest_id": guest_id}
        params = {"agent": agent} if agent else None
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                response = await self.gateway.post("/v1/events", json=body | {"text": text}, params=params)
                if response.status_code == 202:
                    return dict(response.json())
                if response.status_code != 503:
                    raise RuntimeError(f"the gateway answered {response.status_code}: {response.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the gateway never took event {event_id} in {deadline_s}s; logs: {self.logs_dir}"
                )
            await asyncio.sleep(0.2)  # a client's back-off, not synchronisation

    async def start_run(
        self,
        text: str,
        *,
        guest_id: str = "guest-1",
        session_id: str | None = None,
        event_id: str | None = None,
        agent: str | None = None,
    ) -> str:
        """A guest's message (`send`); the id of the run it went to."""
        sent = await self.send(text, guest_id=guest_id, session_id=session_id, event_id=event_id, agent=agent)
        return str(sent["run_id"])

    async def converse(
        self,
        messages: Sequence[str],
        *,
        guest_id: str = "guest-1",
        session_id: str | None = None,
        timeout_s: float = 90.0,
    ) -> list[dict[str, Any]]:
        """A guest's messages in one session, each sent once the run the one before went to has settled (ended, or
        asked for an approval: a guest's "yes" is a message like any other). The summaries of the runs they went
        to, in order, as they stand at the end."""
        session_id = session_id or f"s-{uuid.uuid4().hex[:12]}"
        runs: list[str] = []
        deadline = time.monotonic() + timeout_s
        for n, text in enumerate(messages):
            event_id = f"{session_id}-{n + 1}"
            sent = await self.send(text, guest_id=guest_id, session_id=session_id, event_id=event_id)
            # A turn names the run it was handed to; if that run ended meanwhile, the message starts its own.
            candidates = [str(sent["run_id"]), *([str(sent["event_run_id"])] if sent.get("turn") else [])]
            while (settled := await self._settled(candidates, event_id)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"message {n + 1} ({text!r}) was neither answered nor held for an approval in {timeout_s}s;"
                        f" logs: {self.logs_dir}"
                    )
                await asyncio.sleep(_POLL_S)
            if settled not in runs:
                runs.append(settled)
        return [await self._summary_when_readable(run_id) for run_id in runs]

    # The operator ----------------------------------------------------------------------------------------------

    async def summary(self, run_id: str) -> dict[str, Any] | None:
        """`GET /v1/runs/{id}`; None while the gateway cannot say (the run not journaled yet, the gateway down)."""
        return await self._get(f"/v1/runs/{run_id}")

    async def wait_terminal(self, run_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
        """The run's summary once it completed or was handed off."""
        deadline = time.monotonic() + timeout_s
        while (summary := await self.summary(run_id)) is None or summary["status"] not in ENDED:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not end in {timeout_s}s; logs: {self.logs_dir}")
            await asyncio.sleep(_POLL_S)
        return summary

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's journal as `GET /v1/runs/{id}/events` serves it, each event with its stream `seq`."""
        found = await self._get_when_readable(f"/v1/runs/{run_id}/events")
        return list(found["events"])

    async def crashed(self, timeout_s: float = 0.0) -> list[str]:
        """The armed services that died at their seam (their log says `crashpoint <seam>`) and were restarted by the
        supervisor; waits up to `timeout_s` for every one of them (a kill after a run's last step may land after the
        run ended: the projector's seams always do)."""
        armed = [
            (name, crash.seam)
            for crash in self.crashes
            for name, service in self.stack.services.items()
            if crash.service in (name, service.base)
        ]
        deadline = time.monotonic() + timeout_s
        while True:
            died = [name for name, seam in armed if self._died_at(name, seam)]
            if len(died) == len(armed) or time.monotonic() >= deadline:
                return died
            await asyncio.sleep(_POLL_S)

    async def audit(self) -> EffectAudit:
        """Every journal of the stack against the providers, as `crashsafe audit` judges it."""
        from crashsafe.audit_command import listings
        from crashsafe.domain import registry as registries
        from crashsafe.services.operations.connection import operator_broker
        from crashsafe.services.operations.provider_audit import audit_all
        from crashsafe.services.platform.settings import Settings
        from crashsafe.services.providers.provider_calls import Providers
        from crashsafe.stack_env import operator_env

        settings = Settings.from_env(operator_env(self.stack))
        registry = registries.load(self.registry)
        async with (
            operator_broker(settings, "crashsafe-testing") as broker,
            Providers.open(settings, registry.tools.values()) as providers,
        ):
            listing, _ = await listings(providers, registry)
            findings, stats = await audit_all(broker, settings, registry, providers, listing)
        said = tuple(f"{f.kind}: run {f.run_id or '(none)'} key {f.key}: {f.detail}" for f in findings)
        return EffectAudit(said, stats.keyed_intents, stats.looked_up)

    # Reading through a gateway that may be restarting ---------------------------------------------------------

    def _died_at(self, name: str, seam: str) -> bool:
        log = self.logs_dir / f"{name}.log"
        marked = log.exists() and f"crashpoint {seam}:".encode() in log.read_bytes()
        return marked and self.stack.services[name].restarts >= 1

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            response = await self.gateway.get(path)
        except httpx.TransportError:
            return None
        return dict(response.json()) if response.status_code == 200 else None

    async def _get_when_readable(self, path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (found := await self._get(path)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the gateway did not answer GET {path} in {timeout_s}s; logs: {self.logs_dir}"
                )
            await asyncio.sleep(_POLL_S)
        return found

    async def _summary_when_readable(self, run_id: str) -> dict[str, Any]:
        return await self._get_when_readable(f"/v1/runs/{run_id}")

    async def _settled(self, candidates: list[str], event_id: str) -> str | None:
        """The run that took message `event_id`, once it ended or asked for an approval after it; else None."""
        for run_id in candidates:
            found = await self._get(f"/v1/runs/{run_id}/events")
            events = list(found["events"]) if found else []
            at = next(
                (i for i, e in enumerate(events) if e["type"] in _ARRIVED and e.get("event_id") == event_id),
                None,
            )
            if at is None or (summary := await self.summary(run_id)) is None:
                continue
            if summary["status"] in ENDED:
                return run_id
            asked = any(e["type"] == "run.approval_requested" for e in events[at + 1 :])
            if summary.get("awaiting_approval") and asked:
                return run_id
        return None


@asynccontextmanager
async def real_stack(
    registry: str,
    *,
    model: Script | None = None,
    model_url: str | None = None,
    providers: str | None = None,
    crash: str | Sequence[str] = (),
    tenant: str | None = None,
    state_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[LiveStack]:
    """Start a stack of real processes running `registry` (`module:function`), supervised, and stop it afterwards.

    `model`: a script (`crashsafe.testing.Script`) served on the Responses protocol in this process, or `model_url`
    (`…/v1`); neither: `OPENAI_BASE_URL`, else the sandbox's scripted model. `providers`: the providers' base URL
    (your stub's); none: the sandbox. `crash`: `SEAM[@FAMILY]`, or several in different processes: each service
    armed dies there once and is restarted without it. `tenant`: whose runs these are (each stack its own by
    default, so a provider that outlives one stack never meets its keys again). The stack's logs and data go to
    `state_dir` (default: a temporary folder, removed unless the block raised: the exception names it)."""
    crashes = tuple(
        parse_crash(spec, registry_families(registry))
        for spec in ([crash] if isinstance(crash, str) else crash)
    )
    tenant = tenant or f"test-{secrets.token_hex(4)}"
    owned = state_dir is None
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="crashsafe-stack-"))
    async with AsyncExitStack() as exits:
        if model is not None:
            if model_url is not None:
                raise ValueError("real_stack: give model= or model_url=, not both")
            model_url = await served_model(model, exits)
        stack = Stack(
            state_dir,
            registry=registry,
            providers_url=providers,
            model_url=model_url,
            crash=crash_map(crashes),
            env=dict(env or {}),
        )
        kept = False
        try:
            await asyncio.to_thread(stack.start)
            stop = asyncio.Event()
            supervisor = asyncio.create_task(stack.supervise(stop))
            try:
                key = await asyncio.to_thread(
                    mint_stack_key, stack, _TEST_KEY_FILE, tenant, (Scope.ADMIN,), "crashsafe.testing"
                )
                live = LiveStack(stack, registry, key, tenant, crashes)
                try:
                    yield live
                finally:
                    await live.aclose()
            finally:
                stop.set()
                await supervisor
        except Exception as exc:
            kept = True
            exc.add_note(f"the stack's logs: {stack.logs_dir}")
            raise
        finally:
            await asyncio.to_thread(stack.stop)
            if owned and not kept:
                shutil.rmtree(state_dir, ignore_errors=True)


async def served_model(model: Script, exits: AsyncExitStack) -> str:
    """The script on the Responses protocol, in this process until the stack stops: its base URL (`…/v1`)."""
    from crashsafe.testing.model_server import serve

    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(serve(model, ready=ready.set_result))

    async def stopped() -> None:
        served.cancel()
        with suppress(asyncio.CancelledError):
            await served

    exits.push_async_callback(stopped)
    either: set[asyncio.Future[Any]] = {ready, served}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        served.result()  # it ended before it listened: its error
    return ready.result()
