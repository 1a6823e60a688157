"""`crashsafe crash-test`: an adopter's own conversation, once as it is, then once per named seam on a fresh stack
whose process of that seam SIGKILLs itself there; each judged as the product promises: the runs end as they did
without the crash, with the same effects, each at its provider, found by its key through its own lookup."""

from __future__ import annotations

import argparse
import secrets
import shutil
import tempfile
from collections.abc import Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crashsafe.crash_targets import CRASH_VARIABLE, CrashAt, CrashTargetError, every_crash, parse_crash

if TYPE_CHECKING:
    from rich.console import Console

    from crashsafe.domain.registry import Registry
    from crashsafe.testing.live_stack import LiveStack

# How long past the conversation's end a seam may still be reached (the projector's come after the run ended).
SETTLE_S = 3.0
OK, NOT_REACHED, FAILED = "ok", "not reached", "FAILED"


@dataclass(frozen=True, slots=True)
class Ending:
    """What a conversation came to: each run's status, in order, and every effect its journals hold, as (tool,
    final status) of each write or payment, sorted."""

    statuses: tuple[str, ...]
    effects: tuple[tuple[str, str], ...]

    def said(self) -> str:
        effects = ", ".join(f"{tool} {status}" for tool, status in self.effects) or "no effects"
        return f"{'/'.join(self.statuses)}; {effects}"


@dataclass(frozen=True, slots=True)
class Judged:
    crash: CrashAt | None
    result: str
    detail: str


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    test = sub.add_parser(
        "crash-test",
        help="your conversation with each process killed at each seam in turn (a fresh stack each): every run must "
        "end as it does uncrashed, each keyed effect at its provider once, found by its key; exit 1 on a failure",
    )
    test.add_argument(
        "--registry", default=None, metavar="MODULE:FUNCTION", help="default: CRASHSAFE_REGISTRY"
    )
    test.add_argument(
        "--say",
        action="append",
        default=[],
        metavar="TEXT",
        help="a guest message; repeat for a conversation",
    )
    test.add_argument("--conversation", metavar="FILE", help="the guest's messages, one a line (# a comment)")
    test.add_argument(
        "--model",
        metavar="MODULE:FUNCTION",
        help="a script (crashsafe.testing) served as the model, from here",
    )
    test.add_argument("--model-url", metavar="URL", help="the model's Responses API base URL, /v1 included")
    test.add_argument(
        "--providers", metavar="URL", help="your providers' base URL (your stub's); default: sandbox"
    )
    test.add_argument(
        "--seam",
        action="append",
        default=[],
        metavar="SEAM[@FAMILY]",
        help="only these seams, each of which must be reached (default: every seam of docs/failure-modes.md, an "
        "executor's at each tool family; one the conversation never passes is `not reached`)",
    )
    test.add_argument(
        "--timeout", type=float, default=90.0, help="seconds a conversation may take (default 90)"
    )
    test.add_argument(
        "--state-dir",
        default=None,
        help="the stacks' logs and data (default: a temporary folder, kept if one failed)",
    )


def messages_of(say: Sequence[str], conversation: str | None) -> list[str]:
    lines = Path(conversation).read_text().splitlines() if conversation else []
    return [*(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")), *say]


def crash_test_command(args: argparse.Namespace) -> Coroutine[Any, Any, int] | int:
    from crashsafe.services.platform.settings import Settings
    from crashsafe.stack_plan import RegistryUnusable, registry_families

    registry = args.registry or Settings.from_env().registry
    messages = messages_of(args.say, args.conversation)
    if not messages:
        print("crashsafe crash-test: no conversation: --say TEXT (repeatable) or --conversation FILE")
        return 2
    try:
        families = registry_families(registry)
        crashes = [parse_crash(spec, families) for spec in args.seam] or every_crash(families)
    except (RegistryUnusable, CrashTargetError) as exc:
        print(f"crashsafe crash-test: {exc}")
        return 2
    state_dir = Path(args.state_dir) if args.state_dir else None
    return crash_test(
        registry,
        messages,
        crashes,
        named=bool(args.seam),
        model=args.model,
        model_url=args.model_url,
        providers=args.providers,
        timeout_s=args.timeout,
        state_dir=state_dir,
    )


async def crash_test(
    registry: str,
    messages: Sequence[str],
    crashes: Sequence[CrashAt],
    *,
    named: bool,
    model: str | None,
    model_url: str | None,
    providers: str | None,
    timeout_s: float,
    state_dir: Path | None,
) -> int:
    """The conversation without a crash, then at each seam in turn; a table seam -> result. 1 on any failure."""
    from rich.console import Console

    from crashsafe.domain import registry as registries
    from crashsafe.services.platform.settings import Settings
    from crashsafe.testing.live_stack import served_model
    from crashsafe.testing.model_server import load

    console = Console()
    if (unused := Settings.from_env().crash_at) is not None:
        console.print(f"{CRASH_VARIABLE}={unused} not used: crash-test arms each seam in turn (--seam)")
    root = state_dir or Path(tempfile.mkdtemp(prefix="crashsafe-crash-test-"))
    # Each stack's runs are a tenant of their own: a provider that outlives them never meets one stack's keys again.
    tenants = f"crash-{secrets.token_hex(3)}"
    deployment = registries.load(registry)
    judged: list[Judged] = []
    async with AsyncExitStack() as exits:
        if model:
            model_url = await served_model(load(model), exits)
        run = _Runner(registry, deployment, messages, model_url, providers, timeout_s, root, tenants, console)
        first, baseline = await run.judge(None, 0, None, named)
        judged.append(first)
        if baseline is not None:
            for n, crash in enumerate(crashes, 1):
                judged.append((await run.judge(crash, n, baseline, named))[0])
    _table(console, judged)
    failed = [j for j in judged if j.result == FAILED]
    if failed or baseline is None:
        console.print(
            f"[red]{len(failed)} of {len(judged)} failed[/red]; every stack's logs are under {root}"
        )
        return 1
    if state_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


class _Runner:
    """One conversation on one fresh stack, judged against the conversation without a crash."""

    def __init__(
        self,
        registry: str,
        deployment: Registry,
        messages: Sequence[str],
        model_url: str | None,
        providers: str | None,
        timeout_s: float,
        root: Path,
        tenants: str,
        console: Console,
    ) -> None:
        self.registry, self.deployment, self.messages = registry, deployment, messages
        self.model_url, self.providers, self.timeout_s = model_url, providers, timeout_s
        self.root, self.tenants, self.console = root, tenants, console

    async def judge(
        self, crash: CrashAt | None, n: int, baseline: Ending | None, named: bool
    ) -> tuple[Judged, Ending | None]:
        from crashsafe.testing.live_stack import real_stack

        where = self.root / (f"{n:02d}-{crash.seam}-{crash.service}" if crash else "00-no-crash")
        with self.console.status(f"{crash or 'no crash'}: the conversation on a fresh stack…"):
            try:
                async with real_stack(
                    self.registry,
                    model_url=self.model_url,
                    providers=self.providers,
                    crash=[str(crash)] if crash else (),
                    tenant=f"{self.tenants}-{n}",
                    state_dir=where,
                ) as live:
                    summaries = await live.converse(
                        self.messages, guest_id=f"guest-{n}", timeout_s=self.timeout_s
                    )
                    died = await live.crashed(SETTLE_S) if crash else []
                    ending = await self._ending(live, summaries)
                    audit = await live.audit()
            except Exception as exc:  # noqa: BLE001 - any way the stack or the conversation fails is this seam's result
                judged = Judged(crash, FAILED, f"{type(exc).__name__}: {exc} (logs: {where / 'logs'})")
                self._said(judged)
                return judged, None
        problems = [
            f"run {s['run_id']} did not end: {s['status']}" for s in summaries if s["status"] == "running"
        ]
        if baseline is not None and ending != baseline:
            problems.append(f"ended {ending.said()}; without the crash: {baseline.said()}")
        problems += audit.findings
        if audit.looked_up < audit.keyed:
            problems.append(
                f"{audit.keyed - audit.looked_up} of {audit.keyed} keyed effects not answered by key"
            )
        if crash is not None and not died and named:
            problems.append("never reached: nothing died at this seam, so it proves nothing")
        effects = f"{audit.keyed} keyed effect(s), each at its provider by its key"
        if problems:
            judged = Judged(crash, FAILED, "; ".join(problems) + f" (logs: {where / 'logs'})")
        elif crash is None:
            judged = Judged(crash, OK, f"{ending.said()}; {effects}")
        elif died:
            judged = Judged(crash, OK, f"killed, restarted; ended as without it; {effects}")
        else:
            judged = Judged(
                crash, NOT_REACHED, "the conversation never passed this seam; ended as without it"
            )
        self._said(judged)
        return judged, (ending if judged.result != FAILED else None)

    async def _ending(self, live: LiveStack, summaries: list[dict[str, Any]]) -> Ending:
        from crashsafe.contracts.tools import Effect

        effects: list[tuple[str, str]] = []
        for summary in summaries:
            events = await live.events(summary["run_id"])
            # The last receipt of a step stands: a late resolution replaces an unknown.
            receipts = {e["step_no"]: e["status"] for e in events if e["type"] == "run.action_completed"}
            for event in events:
                tool = self.deployment.tools.get(event.get("tool", ""))
                if event["type"] == "run.action_requested" and tool and tool.contract.effect != Effect.READ:
                    effects.append((event["tool"], receipts.get(event["step_no"], "no receipt")))
        return Ending(tuple(str(s["status"]) for s in summaries), tuple(sorted(effects)))

    def _said(self, judged: Judged) -> None:
        style = {OK: "green", NOT_REACHED: "yellow", FAILED: "red"}[judged.result]
        self.console.print(
            f"{judged.crash or 'no crash'}: [{style}]{judged.result}[/{style}]", highlight=False
        )


def _table(console: Console, judged: list[Judged]) -> None:
    from rich.table import Table

    table = Table(title="crash test: seam -> result")
    for column in ("seam", "process", "result"):
        table.add_column(column, no_wrap=True)
    table.add_column("what happened")
    for j in judged:
        style = {OK: "green", NOT_REACHED: "yellow", FAILED: "red"}[j.result]
        seam, service = (j.crash.seam, j.crash.service) if j.crash else ("(none)", "")
        table.add_row(seam, service, f"[{style}]{j.result}[/{style}]", j.detail)
    console.print(table)
