"""The console's operating pages: approvals waiting, dead letters, audit findings, reconciliation, and the provider's
by-key view on the run page. Each reads and acts through the operator task the API or CLI uses too
(services/operations/: approval_decisions, dead_letters, provider_audit, unknowns, run_journals); every action is a
POST needing `runs:operate` and the session's CSRF token, tenant-scoped exactly as the API is."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import (
    ApprovalNotFound,
    ApprovalNotPending,
    ApproverStartedRun,
    CrashsafeError,
    DeadLetterNotFound,
    RateLimited,
    RunNotFound,
    UnprocessableBody,
)
from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.run_events import RunStarted
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain.access import Client, may_approve, require_approver
from crashsafe.domain.admission import status_for
from crashsafe.domain.registry import Registry
from crashsafe.domain.token_buckets import Rate, TokenBuckets
from crashsafe.services.console.console_router import MAX_FORM_BYTES, Session, check_csrf, render, session_of
from crashsafe.services.console.live import head_seq
from crashsafe.services.operations.approval_decisions import approvals_shown, decide
from crashsafe.services.operations.dead_letter_tasks import (
    DeadLetters,
    Plan,
    Refusal,
    Replan,
    Republish,
    Stored,
    WakeKeys,
    replay_plan,
)
from crashsafe.services.operations.provider_audit import ProviderViews, audit_all, provider_view
from crashsafe.services.operations.run_journals import reconcile_run, run_journal, tenant_of_run
from crashsafe.services.operations.unknowns import unknowns_in
from crashsafe.services.platform.logs import log

logger = logging.getLogger("crashsafe.console")


def _state(request: Request[Any, Any, Any]) -> Any:
    return request.app.state


def _whole_stream_read(request: Request[Any, Any, Any], page: str, wait: bool = False) -> asyncio.Lock:
    """The gateway's one permit per page that reads every run's journal into memory (audit, reconciliation):
    any runs:read key may ask for them at its full rate, and each read at once would hold its own copy of the
    RUNS stream. One per page, so a long audit (its provider lookups) never keeps reconciliation from an
    operator. Busy: RateLimited (429, Retry-After), unless `wait` (the page re-rendered after an action, which
    its own rate already limits)."""
    state = _state(request)
    permit = state.get(f"console_whole_stream_read_{page}")
    if not isinstance(permit, asyncio.Lock):
        permit = state[f"console_whole_stream_read_{page}"] = asyncio.Lock()
    if permit.locked() and not wait:
        raise RateLimited(
            limit="page",
            retry_after_s=2.0,
            message=f"the {page} page reads every journal and one is being read now: reload in a moment",
        )
    return permit


def _outcome(request: Request[Any, Any, Any], status: int) -> int:
    """htmx swaps only 2xx answers: a refused action is shown in the page it re-renders, with its real status
    for any other client (a script, a forged form)."""
    return 200 if request.headers.get("hx-request") else status


async def _tenant_of_run(
    request: Request[Any, Any, Any], run_id: str, cache: dict[str, str | None]
) -> str | None:
    if run_id not in cache:
        state = _state(request)
        cache[run_id] = await tenant_of_run(state.broker, state.settings.namespace, run_id)
    return cache[run_id]


# Approvals ----------------------------------------------------------------------------------------------------


async def _approvals_page(
    request: Request[Any, Any, Any], session: Session, notice: str = "", status_code: int = 200
) -> Response[str]:
    state = _state(request)
    wanted = request.query_params.get("status", ApprovalStatus.PENDING.value)
    if wanted not in {s.value for s in ApprovalStatus}:
        wanted = ApprovalStatus.PENDING.value
    shown = await approvals_shown(
        state.broker, state.settings.namespace, session.client.sees, wanted, datetime.now(UTC)
    )
    return render(
        "approvals.html",
        session,
        page="approvals",
        status_code=status_code,
        approvals=shown,
        wanted=wanted,
        statuses=[s.value for s in ApprovalStatus],
        may_operate=may_approve(session.client),
        notice=notice,
    )


@get("/approvals", include_in_schema=False)
async def approvals_page(request: Request[Any, Any, Any]) -> Response[str]:
    return await _approvals_page(request, await session_of(request))


@post("/approvals/{approval_id:str}", include_in_schema=False, request_max_body_size=MAX_FORM_BYTES)
async def decide_approval(request: Request[Any, Any, Any], approval_id: str) -> Response[str]:
    """The decision the API takes (POST /v1/approvals/{id}), bound to the action the page showed (its input
    hash); decided or expired already: the 409 message, in the page."""
    session = await session_of(request, Scope.APPROVALS_DECIDE)
    require_approver(session.client)  # never a key that may start the runs it would approve
    form = await check_csrf(request, session)
    decision = form.get("decision")
    if decision not in ("approve", "reject"):
        raise UnprocessableBody("decision must be approve or reject")
    status = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.REJECTED
    state = _state(request)
    try:
        moved = await decide(
            state.broker,
            state.settings,
            session.client.sees,
            approval_id,
            status,
            f"manager:console:{session.client.key_id}",
            form.get("reason", "")[:1000],
            input_hash=form.get("input_hash", ""),
            decider=session.client.key_id,  # never the key that started the run, an admin's included
        )
    except (ApprovalNotPending, ApprovalNotFound, ApproverStartedRun, UnprocessableBody) as exc:
        # In the page, as the API would answer it: 409, 404, 403 (this key started the run), 422.
        return await _approvals_page(request, session, exc.message, _outcome(request, status_for(exc)))
    log(logger, logging.INFO, "approval decided", approval_id=approval_id, decision=status.value)
    notice = f"approval {approval_id} {moved.record.status}: run {moved.record.run_id} is woken to go on"
    return await _approvals_page(request, session, notice)


# Dead letters -------------------------------------------------------------------------------------------------


# The dead letters page reads the newest letters only: the DEAD stream keeps 30 days of them, however many a
# flood of poison made, and every load (any runs:read key) would read them all. The CLI lists every one.
SHOWN_LETTERS = 500


@dataclass(frozen=True, slots=True)
class LetterRow:
    stored: Stored
    plan: str
    replayable: bool
    details: str


def _plan_text(plan: Plan) -> tuple[str, bool]:
    match plan:
        case Replan(task=task):
            return f"{task.tool} {task.key} planned again from run {task.run_id}'s journal, sent once", True
        case Republish(subject=subject):
            return f"sent again to {subject} (its consumer dedupes by key)", True
        case WakeKeys(run_id=run_id, keys=keys):
            return f"run {run_id} woken to re-send {', '.join(keys)} (answered from the receipt)", True
        case Refusal(why=why):
            return f"not replayable: {why}", False


async def _visible_letters(
    request: Request[Any, Any, Any], client: Client, letters: list[Stored]
) -> list[Stored]:
    if client.admin:
        return letters
    cache: dict[str, str | None] = {}
    out = []
    for s in letters:
        # A letter about no run it can name is an admin's to see (it may be any tenant's).
        if s.run_id is not None and await _tenant_of_run(request, s.run_id, cache) == client.tenant:
            out.append(s)
    return out


async def _dead_letters_page(
    request: Request[Any, Any, Any], session: Session, notice: str = "", status_code: int = 200
) -> Response[str]:
    state = _state(request)
    show_all = request.query_params.get("all") == "1"
    head = await head_seq(state.broker, state.settings.namespace.stream(StreamKind.DEAD_LETTERS))
    first = max(0, head - SHOWN_LETTERS)
    letters = await DeadLetters(state.broker, state.settings.namespace).list(after_seq=first)
    visible = await _visible_letters(request, session.client, letters)
    now = datetime.now(UTC)
    rows = []
    for s in reversed(visible):
        if s.mark is not None and not show_all:
            continue
        text, replayable = _plan_text(replay_plan(state.settings.namespace, s.letter, now))
        details = msgspec.json.encode(s.letter.details).decode() if s.letter.details else ""
        rows.append(LetterRow(s, text, replayable, details))
    return render(
        "dead_letters.html",
        session,
        page="dead-letters",
        status_code=status_code,
        rows=rows,
        show_all=show_all,
        settled=sum(1 for s in visible if s.mark is not None),
        older=first > 0,
        shown_letters=SHOWN_LETTERS,
        may_operate=session.client.may(Scope.RUNS_OPERATE),
        notice=notice,
    )


@get("/dead-letters", include_in_schema=False)
async def dead_letters_page(request: Request[Any, Any, Any]) -> Response[str]:
    return await _dead_letters_page(request, await session_of(request))


@post("/dead-letters/{seq:int}/{action:str}", include_in_schema=False, request_max_body_size=MAX_FORM_BYTES)
async def settle_dead_letter(request: Request[Any, Any, Any], seq: int, action: str) -> Response[str]:
    session = await session_of(request, Scope.RUNS_OPERATE)
    await check_csrf(request, session)
    if action not in ("replay", "discard"):
        raise UnprocessableBody("a dead letter is replayed or discarded")
    state = _state(request)
    ns = state.settings.namespace
    # No replanner: the gateway may not publish projection tasks (contracts/nats_permissions.py `_operating`), so a
    # dead projection's replay is refused here, naming the operator's command that re-plans it.
    letters = DeadLetters(state.broker, ns)
    by = f"operator:console:{session.client.key_id}"
    try:
        stored = await letters.get(seq)
        if not await _visible_letters(request, session.client, [stored]):
            raise DeadLetterNotFound(stream_seq=seq)  # another tenant's: the answer a missing one gets
        if action == "replay":
            mark = await letters.replay(stored, by)
            notice = f"dead letter {seq} replayed: {mark.replayed_to}"
        else:
            await letters.discard(stored, by)
            notice = f"dead letter {seq} discarded"
    except CrashsafeError as exc:
        return await _dead_letters_page(request, session, exc.message, _outcome(request, status_for(exc)))
    log(logger, logging.INFO, "dead letter settled", seq=seq, action=action)
    return await _dead_letters_page(request, session, notice)


# Audit --------------------------------------------------------------------------------------------------------


@get("/audit", include_in_schema=False)
async def audit_page(request: Request[Any, Any, Any]) -> Response[str]:
    """What `crashsafe audit` reports (every journal against the providers' by-key answers; no provider listing
    from the gateway), for the runs this client sees."""
    session = await session_of(request)
    state = _state(request)
    registry: Registry = state.registry
    # The audit's by-key questions go to the executors: the gateway holds no provider credential.
    views = ProviderViews(state.broker, state.settings.namespace)
    async with _whole_stream_read(request, "audit"):
        findings, stats = await audit_all(
            state.broker, state.settings, registry, views, sees=session.client.sees
        )
    cache: dict[str, str | None] = {}
    shown = [
        f
        for f in findings
        if session.client.admin
        or (f.run_id and await _tenant_of_run(request, f.run_id, cache) == session.client.tenant)
    ]
    return render("audit.html", session, page="audit", findings=shown, stats=stats)


# Reconciliation -----------------------------------------------------------------------------------------------


async def _reconciliation_page(
    request: Request[Any, Any, Any], session: Session, notice: str = "", status_code: int = 200
) -> Response[str]:
    state = _state(request)
    async with _whole_stream_read(request, "reconciliation", wait=bool(notice)):
        unknowns = await unknowns_in(state.broker, state.settings.namespace, session.client.sees)
    return render(
        "reconciliation.html",
        session,
        page="reconciliation",
        status_code=status_code,
        unknowns=unknowns,
        may_operate=session.client.may(Scope.RUNS_OPERATE),
        notice=notice,
    )


@get("/reconciliation", include_in_schema=False)
async def reconciliation_page(request: Request[Any, Any, Any]) -> Response[str]:
    return await _reconciliation_page(request, await session_of(request))


@post("/reconciliation/{run_id:str}", include_in_schema=False, request_max_body_size=MAX_FORM_BYTES)
async def ask_again(request: Request[Any, Any, Any], run_id: str) -> Response[str]:
    """ "Ask again now": what POST /v1/runs/{id}/reconcile does (the run woken naming its open keys), limited
    per run the same way."""
    session = await session_of(request, Scope.RUNS_OPERATE)
    await check_csrf(request, session)
    state = _state(request)
    try:
        tenant = await _tenant_of_run(request, run_id, {})
        if tenant is None or not session.client.sees(tenant):
            raise RunNotFound(run_id=run_id[:64])  # another tenant's: the answer a missing one gets
        door = state.door
        door.limit(door.reconciles, f"{session.client.tenant}/{run_id}", "run")
        done = await reconcile_run(
            state.broker, state.settings, run_id, by=f"operator:console:{session.client.key_id}"
        )
    except CrashsafeError as exc:
        return await _reconciliation_page(request, session, exc.message, _outcome(request, status_for(exc)))
    notice = f"run {run_id} asked to resolve {', '.join(done.asked) or 'nothing open'} by key"
    return await _reconciliation_page(request, session, notice)


# The provider's by-key view (a fragment the run page loads) --------------------------------------------------


# A run page loads its provider view once; each load asks the providers about every action of the run. Per key,
# a few loads at once and one a second after: a runs:read key never turns the gateway into an amplifier against
# the providers the executors need for real actions.
PROVIDER_VIEWS = Rate(per_s=1.0, burst=10.0)


def provider_views_limit(request: Request[Any, Any, Any], client: Client) -> None:
    state = _state(request)
    buckets = state.get("console_provider_views")
    if not isinstance(buckets, TokenBuckets):
        buckets = state["console_provider_views"] = TokenBuckets(PROVIDER_VIEWS)
    state.door.limit(buckets, client.key_id, "provider view")


@get("/runs/{run_id:str}/provider", include_in_schema=False)
async def provider_view_fragment(request: Request[Any, Any, Any], run_id: str) -> Response[str]:
    """For each action of the run: what its provider answers when asked by the action's key, beside our receipt."""
    session = await session_of(request)
    provider_views_limit(request, session.client)
    state = _state(request)
    registry: Registry = state.registry
    if not is_run_id(run_id):
        raise RunNotFound(run_id=run_id[:64])
    ns = state.settings.namespace
    events = [e for _, e in await run_journal(state.broker, ns, run_id)]
    first = events[0] if events else None
    if not isinstance(first, RunStarted) or not session.client.sees(first.tenant):
        raise RunNotFound(run_id=run_id)
    rows = await provider_view(state.broker, ns, registry, events)
    return render("provider_view.html", session, rows=rows, run_id=run_id)


HANDLERS = [
    approvals_page,
    decide_approval,
    dead_letters_page,
    settle_dead_letter,
    audit_page,
    reconciliation_page,
    ask_again,
    provider_view_fragment,
]
