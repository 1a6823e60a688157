"""StayHub's booking agent's rules: search, hold, pay; a paid booking's confirmation email and CRM record follow as
projections. Amounts and recipients come from the server, never the model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date
from typing import Any

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested
from crashsafe.contracts.tool_messages import OutcomeStatus, first_made_by
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import AgentBase, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.guest_scope import in_account
from crashsafe.domain.policy_verdicts import Hold, PolicyRule
from crashsafe.domain.registry import compensation_contracts, model_contracts
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents.booking.booking_arguments import ARGUMENT_TYPES
from crashsafe.services.agents.booking.booking_policy import DEFAULT_RULES, booking_question
from crashsafe.services.agents.booking.booking_tools import SEND_CONFIRMATION_EMAIL, TOOLS, UPDATE_CRM
from crashsafe.services.agents.remember_preference import (
    REMEMBER_PREFERENCE,
    RememberPreferenceArgs,
    prepare_preference,
)

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# The agent's own refusal (`ErrorInfo.code`, open on the wire): a payment or release naming a booking this run never
# held. The same value the runtime's ErrorCode carried before issue 20 moved it here, so clients read no change.
UNKNOWN_BOOKING = "unknown_booking"


INSTRUCTIONS = (
    "You are StayHub's booking assistant. Search hotels, hold a room with create_booking, charge it with "
    "create_payment (pass only the booking_id: the server computes the amount), then tell the guest the booking "
    "is confirmed: the confirmation email and the CRM record follow automatically. Never retry a tool that "
    "failed; explain the failure to the guest instead."
)


def _invalid(message: str, **details: Any) -> ErrorInfo:
    return ErrorInfo(code=ErrorCode.INVALID_TOOL_ARGUMENTS.value, message=message, details=details)


def _dates(args: dict[str, Any]) -> tuple[str, str] | ErrorInfo:
    check_in, check_out = args.get("check_in"), args.get("check_out")
    if not (
        isinstance(check_in, str)
        and isinstance(check_out, str)
        and _DATE.match(check_in)
        and _DATE.match(check_out)
    ):
        return _invalid("check_in and check_out must be dates as YYYY-MM-DD")
    try:
        if date.fromisoformat(check_out) <= date.fromisoformat(check_in):
            return _invalid("check_out must be after check_in", check_in=check_in, check_out=check_out)
    except ValueError:
        return _invalid("check_in and check_out must be real calendar dates")
    return check_in, check_out


def _string(args: dict[str, Any], name: str) -> str | ErrorInfo:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        return _invalid(f"{name} is required and must be a non-empty string")
    return value


class BookingAgent(AgentBase):
    name = "booking"
    instructions = INSTRUCTIONS
    tools = model_contracts((*TOOLS, REMEMBER_PREFERENCE))
    compensation_tools = compensation_contracts(TOOLS)
    argument_types = ARGUMENT_TYPES | {REMEMBER_PREFERENCE.name: RememberPreferenceArgs}
    config = AgentConfig(agent="booking", rules=list(DEFAULT_RULES), memory=True, retrieval=True)
    policies: tuple[PolicyRule, ...] = ()
    projection_tools = frozenset({SEND_CONFIRMATION_EMAIL.name, UPDATE_CRM.name})

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        return booking_question(state, tool, args, hold)

    def script(self, state: RunState) -> ScriptedStep | None:
        return None  # the model decides

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        """A paid booking that stayed paid (not released, not refunded in the run): its confirmation email, to the
        guest's verified address only, and its CRM record. Decided from the journal; keyed by the booking."""
        undone = {
            str(req.args.get("booking_id", ""))
            for req, done in state.completed
            if req.tool in ("release_booking", "refund_payment") and done.status == OutcomeStatus.SUCCEEDED
        }
        calls: list[ProjectionCall] = []
        confirmed: set[str] = set()
        for req, done in state.completed:
            booking_id = str(req.args.get("booking_id", ""))
            if (
                req.tool != "create_payment"
                or done.status != OutcomeStatus.SUCCEEDED
                or not booking_id
                or booking_id in undone
                or booking_id in confirmed
            ):
                continue
            confirmed.add(booking_id)
            email: dict[str, Any] = in_account(state, {"booking_id": booking_id, "guest_id": state.guest_id})
            profile = state.started.profile
            if profile is not None and profile.verified_email:
                email["to"] = profile.verified_email
            calls.append(ProjectionCall(SEND_CONFIRMATION_EMAIL.name, email))
            crm = in_account(state, {"booking_id": booking_id, "guest_id": state.guest_id})
            calls.append(ProjectionCall(UPDATE_CRM.name, crm))
        return tuple(calls)

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        """Release holds whose payment definitively failed (or, at the end, was never made); refund orphan charges."""
        actions = [(req, done) for req, done in state.completed] + [(req, None) for req in state.pending]

        def about(tool: str, booking_id: str) -> list[tuple[ActionRequested, ActionCompleted | None]]:
            return [(r, d) for r, d in actions if r.tool == tool and r.args.get("booking_id") == booking_id]

        undo: list[Compensation] = []
        for req, done in state.completed:
            if req.tool != "create_booking" or done.status != OutcomeStatus.SUCCEEDED:
                continue
            booking_id = str(done.result.get("booking_id", ""))
            releases = about("release_booking", booking_id)
            payments = about("create_payment", booking_id)
            if not releases:
                if any(
                    d is None or d.status in (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN)
                    for _, d in payments
                ):
                    continue  # paid, being paid, or maybe paid: never release what might be paid for
                if any(d is not None and d.status == OutcomeStatus.FAILED for _, d in payments) or ending:
                    undo.append(
                        Compensation(
                            tool="release_booking",
                            args={"booking_id": booking_id},
                            undoes=req.key,
                            kind=CompensationKind.RELEASE,
                        )
                    )
                continue
            released = any(d is not None and d.status == OutcomeStatus.SUCCEEDED for _, d in releases)
            for pay_req, pay_done in payments:
                if (
                    released
                    and pay_done is not None
                    and pay_done.status == OutcomeStatus.SUCCEEDED
                    and not about_refund(actions, pay_req.key)
                ):
                    args = {
                        "payment_id": pay_done.result.get("payment_id"),
                        "amount_cents": pay_req.args.get("amount_cents"),
                        "booking_id": booking_id,
                    }
                    undo.append(
                        Compensation(
                            tool="refund_payment", args=args, undoes=pay_req.key, kind=CompensationKind.REFUND
                        )
                    )
        return tuple(undo)

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        # The model never names an amount: the policy denies a call that does (`server_computed_amount`) before
        # this runs. A compensation (never offered to the model) carries the amount of the journaled charge it
        # undoes, which the server computed: `compensations` builds a refund's arguments.
        match tool.name:
            case "search_hotels":
                city = _string(args, "city")
                if isinstance(city, ErrorInfo):
                    return city
                dates = _dates(args)
                if isinstance(dates, ErrorInfo):
                    return dates
                return {"city": city, "check_in": dates[0], "check_out": dates[1]}
            case "create_booking":
                hotel_id = _string(args, "hotel_id")
                if isinstance(hotel_id, ErrorInfo):
                    return hotel_id
                dates = _dates(args)
                if isinstance(dates, ErrorInfo):
                    return dates
                hold = {"hotel_id": hotel_id, "check_in": dates[0], "check_out": dates[1]}
                return in_account(state, hold | {"guest_id": state.guest_id})
            case "create_payment":
                booking = self._held_booking(state, args)
                if isinstance(booking, ErrorInfo):
                    return booking
                maker = self._made_by_another_run(state, booking["booking_id"])
                if maker is not None:
                    # The run that made the hold pays it or lets it go; paid here, it would be let go there.
                    return ErrorInfo(
                        code=ErrorCode.INVALID_TOOL_ARGUMENTS.value,
                        message=f"booking {booking['booking_id']} is held by another conversation ({maker}); "
                        "it is paid or released there, never here",
                        details={"booking_id": booking["booking_id"], "held_by": maker},
                    )
                if self._already(state, "create_payment", booking["booking_id"]):
                    return ErrorInfo(
                        code=ErrorCode.INVALID_TOOL_ARGUMENTS.value,
                        message=f"booking {booking['booking_id']} is already paid or being paid in this run",
                        details={"booking_id": booking["booking_id"]},
                    )
                charge = {
                    "booking_id": booking["booking_id"],
                    "guest_id": state.guest_id,
                    "amount_cents": int(booking["total_cents"]),
                    # Never a guessed currency: none from the provider is refused by the policy.
                    "currency": str(booking.get("currency") or ""),
                }
                return in_account(state, charge)
            case "release_booking":
                booking_id = _string(args, "booking_id")
                if isinstance(booking_id, ErrorInfo):
                    return booking_id
                return in_account(state, {"booking_id": booking_id})
            case "refund_payment":
                payment_id = _string(args, "payment_id")
                if isinstance(payment_id, ErrorInfo):
                    return payment_id
                refund = {
                    "payment_id": payment_id,
                    "amount_cents": int(args.get("amount_cents") or 0),
                    "booking_id": str(args.get("booking_id", "")),
                }
                return in_account(state, refund)
            case "remember_preference":
                return prepare_preference(state, args)
        # The email and the CRM record are not prepared here: never the model's tools, they are projections
        # (`projections`), and a step of theirs journaled before the change is served as journaled.
        return _invalid(f"no argument rules for {tool.name}")

    @staticmethod
    def _held_booking(state: RunState, args: dict[str, Any]) -> dict[str, Any] | ErrorInfo:
        booking_id = _string(args, "booking_id")
        if isinstance(booking_id, ErrorInfo):
            return booking_id
        for result in state.succeeded_results("create_booking"):
            if result.get("booking_id") == booking_id:
                return result
        return ErrorInfo(
            code=UNKNOWN_BOOKING,
            message=f"booking {booking_id} was not created in this run; create_booking first",
            details={"booking_id": booking_id},
        )

    @staticmethod
    def _made_by_another_run(state: RunState, booking_id: str) -> str | None:
        """The run that made this hold, if this run only has its receipt from the store (the same room asked
        again); None if this run made it."""
        makers = {
            first_made_by(done.evidence) or state.run_id
            for req, done in state.completed
            if req.tool == "create_booking"
            and done.status == OutcomeStatus.SUCCEEDED
            and done.result.get("booking_id") == booking_id
        }
        return None if not makers or state.run_id in makers else sorted(makers)[0]

    @staticmethod
    def _already(state: RunState, tool: str, booking_id: str) -> bool:
        in_flight = any(p.tool == tool and p.args.get("booking_id") == booking_id for p in state.pending)
        done = any(
            req.tool == tool
            and req.args.get("booking_id") == booking_id
            and done.status in (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN)
            for req, done in state.completed
        )
        return in_flight or done


def about_refund(actions: Sequence[tuple[ActionRequested, ActionCompleted | None]], payment_key: str) -> bool:
    return any(r.tool == "refund_payment" and r.key.startswith(payment_key + ":") for r, _ in actions)
