"""Plays the scenarios against the product's own stack (embedded nats-server, sandbox, every service) in a temp
state dir, as a guest and an operator would: only over the gateway's HTTP API with the stack's API key (a manager's
decisions with its approver key), plus the sandbox providers' ledger to count what really happened."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import msgspec

from crashsafe.contracts.headers import Header
from crashsafe.contracts.keys import provider_account
from crashsafe.evals import operator
from crashsafe.evals.checks import Observed, RunView, eventual, failures
from crashsafe.evals.conversation import Action, AwaitExpiry, Decide, RestartAll, Say, Scenario
from crashsafe.sandbox.listing import SandboxListing
from crashsafe.stack import Stack

# How long one step of a conversation may take to settle (a booking's deadline is 90 s), and an expiry past its ttl.
SETTLE_S = 90.0
# How long the projections of a conversation's runs (the confirmation email, the CRM record) may take to arrive.
PROJECTED_S = 90.0
EXPIRY_GRACE_S = 60.0
POLL_S = 0.1
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"


class ModelChoice(StrEnum):
    SCRIPTED = "scripted"  # the sandbox's scripted model (CI)
    OPENAI = "openai"  # the real provider: OPENAI_API_KEY, CRASHSAFE_MODEL, OPENAI_BASE_URL


def model_env(model: ModelChoice, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The stack's environment for `model`: the scripted model clears any real provider the shell has set."""
    environ = dict(os.environ if environ is None else environ)
    if model == ModelChoice.SCRIPTED:
        return {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": "", "CRASHSAFE_MODEL": ""}
    if not environ.get("OPENAI_API_KEY"):
        raise ValueError(
            "--model openai needs OPENAI_API_KEY (and CRASHSAFE_MODEL, OPENAI_BASE_URL if not OpenAI's)"
        )
    return {"CRASHSAFE_MODEL": environ.get("CRASHSAFE_MODEL") or DEFAULT_OPENAI_MODEL}


@dataclass
class Result:
    scenario: Scenario
    problems: list[str] = field(default_factory=list)
    skipped: bool = False
    seconds: float = 0.0
    runs: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems and not self.skipped


class Settled(Exception):
    """A conversation step did not settle in time: the scenario fails with what the runs showed."""


class EvalStack:
    """One running stack and the HTTP clients a guest and an operator use on it."""

    def __init__(self, stack: Stack, model: ModelChoice) -> None:
        self.stack = stack
        self.model = model
        self.gateway = httpx.AsyncClient(
            base_url=stack.gateway_url, timeout=20.0, headers={"authorization": f"Bearer {stack.api_key}"}
        )
        # The manager decides with the stack's approver key: the admin key started the runs, so it may not.
        self.manager = httpx.AsyncClient(
            base_url=stack.gateway_url,
            timeout=20.0,
            headers={"authorization": f"Bearer {stack.approver_key}"},
        )
        self.sandbox = httpx.AsyncClient(base_url=stack.sandbox_url, timeout=20.0)

    async def aclose(self) -> None:
        await self.gateway.aclose()
        await self.manager.aclose()
        await self.sandbox.aclose()


@asynccontextmanager
async def running_stack(model: ModelChoice, state_dir: Path | None = None) -> AsyncIterator[EvalStack]:
    """The product's stack as `crashsafe up` runs it, supervised, in `state_dir` (a temp dir by default)."""
    env = model_env(model)
    with tempfile.TemporaryDirectory(prefix="crashsafe-evals-") as temp:
        stack = Stack(Path(state_dir or temp), env=env)
        try:
            await asyncio.to_thread(stack.start)
        except BaseException:
            await asyncio.to_thread(stack.stop)
            raise
        stop = asyncio.Event()
        supervisor = asyncio.create_task(stack.supervise(stop))
        evals = EvalStack(stack, model)
        try:
            yield evals
        finally:
            await evals.aclose()
            stop.set()
            await supervisor
            await asyncio.to_thread(stack.stop)


async def run_suite(evals: EvalStack, scenarios: Sequence[Scenario]) -> list[Result]:
    """Every scenario, one after the other (a catalog published for one must not touch another's runs); those
    that publish a catalog go last, and the catalog is put back after each."""
    ordered = sorted(scenarios, key=lambda s: s.approval_ttl_s is not None)
    results = [await play(evals, s, n) for n, s in enumerate(ordered)]
    order = {id(s): i for i, s in enumerate(scenarios)}
    return sorted(results, key=lambda r: order[id(r.scenario)])


async def play(evals: EvalStack, scenario: Scenario, n: int = 0) -> Result:
    result = Result(scenario)
    if scenario.scripted_only and evals.model != ModelChoice.SCRIPTED:
        result.skipped = True
        return result
    started = time.monotonic()
    conversation = Conversation(evals, f"eval-{n}-{_slug(scenario.name)}-{uuid.uuid4().hex[:6]}")
    restore = None
    try:
        if scenario.guest is not None:
            await operator.set_guest(
                evals.stack.state_dir,
                conversation.guest_id,
                verified_email=scenario.guest.verified_email,
                corporate=scenario.guest.corporate,
                manager=scenario.guest.manager,
            )
        if scenario.approval_ttl_s is not None:
            restore = await operator.current_catalog(evals.stack.state_dir)
            await operator.publish(
                evals.stack.state_dir, operator.with_approval_ttl(restore, scenario.approval_ttl_s)
            )
        for action in scenario.actions:
            await conversation.act(action, scenario)
    except (operator.OperatorError, Settled, httpx.HTTPError, AssertionError) as exc:
        result.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if restore is not None:
            try:
                await operator.publish(evals.stack.state_dir, restore)
            except operator.OperatorError as exc:
                result.problems.append(f"could not put the catalog back: {exc}")
    if result.problems:
        result.problems.append("expectations not checked: the conversation did not get to its end")
    else:
        try:
            result.problems += failures(scenario.expect, await conversation.projected(scenario))
        except httpx.HTTPError as exc:
            result.problems.append(f"could not read what happened: {exc}")
    result.runs = list(conversation.runs)
    result.seconds = time.monotonic() - started
    return result


class Conversation:
    """One guest's conversation: their messages, the runs they start, the approvals an operator decides."""

    def __init__(self, evals: EvalStack, guest_id: str) -> None:
        self.evals = evals
        self.guest_id = guest_id
        self.session_id = f"s-{guest_id}"
        self.sessions = 0
        self.turns = 0
        self.runs: list[str] = []
        # Approvals decided (or left to expire): a run still waiting on one is not done yet.
        self.answered: set[str] = set()
        self.listed_pending: set[str] = set()
        self.decided: list[str] = []  # approvals the operator decided, in order

    async def act(self, action: Action, scenario: Scenario) -> None:
        match action:
            case Say():
                # A message while a run waits may be its answer ("yes"): the run is done only once it moved on.
                self.answered |= await self.waiting()
                await self.say(action)
                await self.settle(SETTLE_S)
            case Decide(again=True):
                await self.decide_again(action)
            case Decide():
                approval = await self.awaited()
                response = await self.decide(approval, action)
                if not response.is_success:
                    raise AssertionError(
                        f"POST /v1/approvals/{approval}: {response.status_code} {response.text}"
                    )
                self.answered.add(approval)
                self.decided.append(approval)
                await self.settle(SETTLE_S)
            case RestartAll():
                # Blocking on purpose: the supervisor (a task on this loop) must not see a service dead between
                # the kill and the new process, or it would start a second one.
                for name in list(self.evals.stack.services):
                    self.evals.stack.restart(name)
            case AwaitExpiry():
                self.answered.add(await self.awaited())
                await self.settle((scenario.approval_ttl_s or 0.0) + EXPIRY_GRACE_S)

    async def decide(self, approval: str, action: Decide) -> httpx.Response:
        body = {"decision": action.decision, "approver": action.approver, "reason": action.reason}
        return await self.evals.manager.post(f"/v1/approvals/{approval}", json=body)

    async def decide_again(self, action: Decide) -> None:
        if not self.decided:
            raise AssertionError("nothing was decided yet to decide again")
        approval = self.decided[-1]
        response = await self.decide(approval, action)
        code = response.json().get("error", {}).get("code") if response.status_code == 409 else None
        if code != "approval_not_pending":
            raise AssertionError(
                f"deciding {approval} again answered {response.status_code} {response.text}, "
                "expected 409 approval_not_pending"
            )

    async def say(self, said: Say) -> None:
        if said.new_session:
            self.sessions += 1
            self.session_id = f"s-{self.guest_id}-{self.sessions}"
        self.turns += 1
        text = said.text
        if "{booking_id}" in text:
            text = text.replace("{booking_id}", await self.latest_booking())
        body = {
            "event_id": f"ev-{self.guest_id}-{self.turns}",
            "session_id": self.session_id,
            "guest_id": self.guest_id,
            "text": text,
        }
        response = await self.evals.gateway.post("/v1/events", json=body, params={"agent": said.agent})
        if response.status_code != 202:
            raise AssertionError(f"POST /v1/events: {response.status_code} {response.text}")
        run_id = str(response.json()["run_id"])
        if run_id not in self.runs:
            self.runs.append(run_id)

    async def latest_booking(self) -> str:
        view = await SandboxListing(self.evals.sandbox).view(self.guest_id)
        bookings = [e.ref for e in view.entries if e.kind.value == "booking"]
        if not bookings:
            raise AssertionError("the scenario refers to {booking_id}, but the guest has no booking")
        return bookings[-1]

    async def summary(self, run_id: str) -> dict[str, Any] | None:
        response = await self.evals.gateway.get(f"/v1/runs/{run_id}")
        return dict(response.json()) if response.status_code == 200 else None

    def _done(self, summary: dict[str, Any] | None) -> bool:
        if summary is None:
            return False
        if summary.get("status") != "running":
            return True
        waiting = summary.get("awaiting_approval")
        return bool(waiting) and waiting not in self.answered

    async def settle(self, timeout_s: float) -> None:
        """Until every run of the conversation ended or waits for an approval nobody has answered yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            summaries = [await self.summary(r) for r in self.runs]
            for summary in summaries:
                if summary and summary.get("awaiting_approval") and summary.get("status") == "running":
                    await self.note_pending()
            if all(self._done(s) for s in summaries):
                return
            if time.monotonic() > deadline:
                shown = [(s or {}).get("status", "unknown") for s in summaries]
                raise Settled(f"runs {self.runs} did not settle in {timeout_s:g}s: {shown}")
            await asyncio.sleep(POLL_S)

    async def waiting(self) -> set[str]:
        """The approvals the conversation's runs wait for now."""
        summaries = [await self.summary(r) for r in self.runs]
        return {
            str(s["awaiting_approval"])
            for s in summaries
            if s and s.get("status") == "running" and s.get("awaiting_approval")
        }

    async def awaited(self) -> str:
        """The approval the conversation's latest waiting run waits for."""
        for run_id in reversed(self.runs):
            summary = await self.summary(run_id)
            if summary and summary.get("status") == "running" and summary.get("awaiting_approval"):
                return str(summary["awaiting_approval"])
        raise AssertionError("no run of the conversation waits for an approval")

    async def note_pending(self) -> None:
        response = await self.evals.gateway.get("/v1/approvals", params={"status": "pending"})
        if response.status_code != 200:
            return
        body = response.json()
        records = body if isinstance(body, list) else body.get("approvals", body.get("items", []))
        self.listed_pending |= {
            str(r["approval_id"]) for r in records if isinstance(r, dict) and r.get("run_id") in self.runs
        }

    async def projected(self, scenario: Scenario) -> Observed:
        """What the conversation left, once its runs' projections the scenario expects have arrived (or
        PROJECTED_S has passed: then the checks say what is missing)."""
        waiting = eventual(scenario.expect)
        deadline = time.monotonic() + PROJECTED_S
        seen = await self.observe()
        while waiting and failures(waiting, seen) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S * 5)
            seen = await self.observe()
        return seen

    async def observe(self) -> Observed:
        runs = []
        for run_id in self.runs:
            summary = await self.summary(run_id) or {}
            response = await self.evals.gateway.get(f"/v1/runs/{run_id}/events")
            events = list(response.json()["events"]) if response.status_code == 200 else []
            runs.append(RunView(run_id, summary, events))
        view = await SandboxListing(self.evals.sandbox).view(self.guest_id)
        # A provider keeps each account's keys apart: the email is asked for in the account its run acted in.
        account = next((_account_of(run.events) for run in runs if _account_of(run.events)), "")
        headers = {Header.PROVIDER_ACCOUNT.value: account} if account else {}
        emails = []
        for entry in view.entries:
            if entry.kind.value == "email":
                found = await self.evals.sandbox.get(f"/emails/by-key/{entry.key}", headers=headers)
                emails.append(dict(found.json()) if found.status_code == 200 else {"key": entry.key})
        return Observed(
            runs=runs,
            ledger=[msgspec.to_builtins(e) for e in view.entries],
            listed_pending=frozenset(self.listed_pending),
            scripted=self.evals.model == ModelChoice.SCRIPTED,
            emails=emails,
        )


def _account_of(events: list[dict[str, Any]]) -> str:
    """The provider account a run acted in, from its `run.started` ("" for none journaled yet)."""
    started = next((e for e in events if e.get("type") == "run.started"), None)
    if started is None:
        return ""
    return provider_account(str(started.get("tenant", "")), str(started.get("guest_scope", "")))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]


def report(results: Sequence[Result]) -> str:
    """A pass rate per scenario class and in total, then each failure with what was wrong."""
    lines = []
    classes = sorted(
        {r.scenario.klass for r in results}, key=lambda k: [r.scenario.klass for r in results].index(k)
    )
    total = passed = 0
    for klass in classes:
        of = [r for r in results if r.scenario.klass == klass and not r.skipped]
        ok = sum(r.passed for r in of)
        total, passed = total + len(of), passed + ok
        skipped = sum(r.skipped for r in results if r.scenario.klass == klass)
        extra = f", {skipped} skipped (scripted model only)" if skipped else ""
        lines.append(f"{klass.value:<10} {ok}/{len(of)} passed{_rate(ok, len(of))}{extra}")
    lines.append(f"{'total':<10} {passed}/{total} passed{_rate(passed, total)}")
    for r in results:
        mark = "skip" if r.skipped else ("pass" if r.passed else "FAIL")
        lines.append(f"  {mark} [{r.scenario.klass.value}] {r.scenario.name} ({r.seconds:.1f}s)")
        if r.problems:
            for problem in r.problems:
                lines.append(f"       - {problem}")
            if r.scenario.needs:
                lines.append(f"       needs: {', '.join(r.scenario.needs)}; runs: {', '.join(r.runs) or '-'}")
    return "\n".join(lines)


def _rate(ok: int, of: int) -> str:
    return f" ({100 * ok / of:.0f}%)" if of else ""
