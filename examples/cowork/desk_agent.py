"""The coworking agent's rules: find a desk, reserve it, pay its day pass at the price the provider quoted, and give
the desk back if the pass is not paid. Pure functions of the run's journal, as the runtime requires."""

from __future__ import annotations

from typing import Any

from crashsafe.examples.cowork.desk_tools import ARGUMENT_TYPES, TOOLS
from crashsafe.sdk import (
    AgentBase,
    AgentConfig,
    Allow,
    ApprovalAbove,
    Approver,
    Compensation,
    CompensationKind,
    Deny,
    ErrorCode,
    ErrorInfo,
    Hold,
    OutcomeStatus,
    PolicyRule,
    PreparedAction,
    RunState,
    ToolContract,
    Verdict,
    in_account,
)

INSTRUCTIONS = (
    "You book desks at a coworking space. Find free desks with find_desks, reserve one with reserve_desk, then "
    "buy its day pass with buy_day_pass passing only the reservation_id (the server prices it). Never retry a "
    "tool that failed: tell the member what happened."
)

# Passes above 50.00 wait for the member's "yes" (a private office is dear; a desk is not).
APPROVAL_LIMIT_CENTS = 5_000
RULES = (
    ApprovalAbove(
        tool="buy_day_pass",
        limit_cents=APPROVAL_LIMIT_CENTS,
        approver=Approver.GUEST.value,
        for_field="reservation_id",  # the same reservation's pass asked again is not a second charge
    ),
)

# A pass that is paid, being paid, or maybe paid: its desk is never given back.
_MAYBE_PAID = (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN)

# A rule of the space's own, which no built-in expresses: one conversation holds at most two desks (a member
# booking a team's week asks the front desk).
MAX_DESKS_PER_CONVERSATION = 2


def desks_per_conversation(action: PreparedAction, state: RunState) -> Verdict:
    """Deny a third reservation in one conversation; desks given back (or being given back) do not count."""
    if action.tool.name != "reserve_desk":
        return Allow()
    held = [p.args for p in state.pending if p.tool == "reserve_desk"]
    held += [
        {**req.args, **done.result}
        for req, done in state.completed
        if req.tool == "reserve_desk" and done.status in _MAYBE_PAID
    ]
    kept = [r for r in held if not _asked(state, "release_desk", str(r.get("reservation_id", "")), None)]
    if len(kept) >= MAX_DESKS_PER_CONVERSATION:
        return Deny(
            "desks_per_conversation",
            f"this conversation already holds {len(kept)} desks; the front desk books more than "
            f"{MAX_DESKS_PER_CONVERSATION}",
        )
    return Allow()


def _refused(message: str, **details: Any) -> ErrorInfo:
    return ErrorInfo(code=ErrorCode.INVALID_TOOL_ARGUMENTS, message=message, details=details)


class CoworkAgent(AgentBase):
    name = "cowork"
    instructions = INSTRUCTIONS
    tools = {t.name: t.contract for t in TOOLS if not t.compensation_only}
    compensation_tools = {t.name: t.contract for t in TOOLS if t.compensation_only}
    argument_types = ARGUMENT_TYPES
    config = AgentConfig(agent="cowork", rules=list(RULES))
    policies: tuple[PolicyRule, ...] = (PolicyRule("desks_per_conversation", desks_per_conversation),)

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        """What the member is asked: the desk's day pass, its zone and day, at the provider's price."""
        reserved = next(
            (
                r
                for r in state.succeeded_results("reserve_desk")
                if r.get("reservation_id") == args.get("reservation_id")
            ),
            {},
        )
        price = f"{args.get('currency', '')} {int(args.get('amount_cents', 0)) / 100:.2f}"
        return (
            f"Reply yes to pay {price} for the day pass of a desk in the {reserved.get('zone', '')} zone on "
            f"{reserved.get('day', '')}"
        )

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        """The arguments are already checked against `argument_types`; here the server adds what only it knows:
        who the member is, and the price of the reservation being paid."""
        match tool.name:
            case "find_desks":
                return {"day": args["day"], **({"zone": args["zone"]} if args.get("zone") else {})}
            case "reserve_desk":
                return in_account(
                    state, {"member_id": state.guest_id, "zone": args["zone"], "day": args["day"]}
                )
            case "buy_day_pass":
                return self._pass(state, str(args["reservation_id"]))
            case "release_desk":
                return in_account(state, {"reservation_id": str(args["reservation_id"])})
        return _refused(f"no argument rules for {tool.name}")

    def _pass(self, state: RunState, reservation_id: str) -> dict[str, Any] | ErrorInfo:
        reserved = next(
            (r for r in state.succeeded_results("reserve_desk") if r.get("reservation_id") == reservation_id),
            None,
        )
        if reserved is None:
            return _refused(
                f"reservation {reservation_id} was not made in this conversation; reserve_desk first"
            )
        if _asked(state, "buy_day_pass", reservation_id, _MAYBE_PAID):
            return _refused(f"the day pass of {reservation_id} is already paid or being paid")
        # The price is the provider's answer to the reservation, never the model's.
        return in_account(
            state,
            {
                "reservation_id": reservation_id,
                "member_id": state.guest_id,
                "amount_cents": int(reserved["price_cents"]),
                "currency": str(reserved["currency"]),
            },
        )

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        """Give back a desk whose pass was declined (or, as the run ends, never bought); never one maybe paid."""
        undo: list[Compensation] = []
        for req, done in state.completed:
            if req.tool != "reserve_desk" or done.status != OutcomeStatus.SUCCEEDED:
                continue
            reservation_id = str(done.result.get("reservation_id", ""))
            if _asked(state, "release_desk", reservation_id, None):
                continue  # released, or being released: once
            if _asked(state, "buy_day_pass", reservation_id, _MAYBE_PAID):
                continue
            declined = _asked(state, "buy_day_pass", reservation_id, (OutcomeStatus.FAILED,))
            if declined or ending:
                args = {"reservation_id": reservation_id}
                undo.append(Compensation("release_desk", args, undoes=req.key, kind=CompensationKind.RELEASE))
        return tuple(undo)


def _asked(state: RunState, tool: str, reservation_id: str, outcomes: tuple[str, ...] | None) -> bool:
    """Whether this run asked `tool` for the reservation: in flight, or completed with one of `outcomes`
    (None: any)."""
    if any(p.tool == tool and p.args.get("reservation_id") == reservation_id for p in state.pending):
        return outcomes is None or OutcomeStatus.UNKNOWN in outcomes
    return any(
        req.tool == tool
        and req.args.get("reservation_id") == reservation_id
        and (outcomes is None or done.status in outcomes)
        for req, done in state.completed
    )
