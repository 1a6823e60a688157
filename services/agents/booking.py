"""StayHub's booking agent: search, hold, pay, confirm, update CRM. Amounts come from the server, never the model."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from contracts.errors import ErrorCode, ErrorInfo
from contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from services.runtime.core.agent import ScriptedStep
from services.runtime.core.state import RunState

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_STR = {"type": "string"}
_DATE_SCHEMA = {"type": "string", "description": "ISO date, YYYY-MM-DD"}

TOOLS: dict[str, ToolContract] = {
    t.name: t
    for t in (
        ToolContract(
            name="search_hotels",
            family="booking",
            effect=Effect.READ,
            timeout_s=2.0,
            retry=RetryRule.RETRY,
            max_attempts=3,
            key_rule=KeyRule.NONE,
            description="Find hotels with rooms in a city for the dates.",
            parameters=_obj({"city": _STR, "check_in": _DATE_SCHEMA, "check_out": _DATE_SCHEMA}, ["city", "check_in", "check_out"]),
        ),
        ToolContract(
            name="create_booking",
            family="booking",
            effect=Effect.WRITE,
            timeout_s=5.0,
            retry=RetryRule.KEYED,
            max_attempts=2,
            compensation="release_booking",
            description="Hold a room for the guest. Returns a booking_id and the total price.",
            parameters=_obj({"hotel_id": _STR, "check_in": _DATE_SCHEMA, "check_out": _DATE_SCHEMA}, ["hotel_id", "check_in", "check_out"]),
        ),
        ToolContract(
            name="create_payment",
            family="payment",
            effect=Effect.MONEY,
            timeout_s=10.0,
            retry=RetryRule.NEVER_BLIND,
            max_attempts=2,
            compensation="refund_payment",
            description="Charge the guest for a held booking. The amount is computed by the server from the booking.",
            parameters=_obj({"booking_id": _STR}, ["booking_id"]),
        ),
        ToolContract(
            name="send_confirmation_email",
            family="notify",
            effect=Effect.WRITE,
            timeout_s=3.0,
            retry=RetryRule.KEYED,
            max_attempts=5,
            description="Email the guest the confirmation of a paid booking.",
            parameters=_obj({"booking_id": _STR}, ["booking_id"]),
        ),
        ToolContract(
            name="update_crm",
            family="notify",
            effect=Effect.WRITE,
            timeout_s=3.0,
            retry=RetryRule.KEYED,
            max_attempts=5,
            description="Record the booking on the guest's CRM profile.",
            parameters=_obj({"booking_id": _STR}, ["booking_id"]),
        ),
    )
}

INSTRUCTIONS = (
    "You are StayHub's booking assistant. Search hotels, hold a room with create_booking, charge it with "
    "create_payment (pass only the booking_id: the server computes the amount), then send the confirmation "
    "email and update the CRM. Never retry a tool that failed; explain the failure to the guest instead."
)


def _invalid(message: str, **details: Any) -> ErrorInfo:
    return ErrorInfo(code=ErrorCode.INVALID_TOOL_ARGUMENTS.value, message=message, details=details)


def _dates(args: dict[str, Any]) -> tuple[str, str] | ErrorInfo:
    check_in, check_out = args.get("check_in"), args.get("check_out")
    if not (isinstance(check_in, str) and isinstance(check_out, str) and _DATE.match(check_in) and _DATE.match(check_out)):
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


class BookingAgent:
    name = "booking"
    instructions = INSTRUCTIONS
    tools = TOOLS

    def script(self, state: RunState) -> ScriptedStep | None:
        return None  # the model decides

    def prepare(self, state: RunState, tool: ToolContract, args: dict[str, Any]) -> dict[str, Any] | ErrorInfo:
        if "amount" in args or "amount_cents" in args:
            return _invalid("the amount is computed by the server from the booking; pass only booking_id")
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
                return {"hotel_id": hotel_id, "guest_id": state.guest_id, "check_in": dates[0], "check_out": dates[1]}
            case "create_payment":
                booking = self._held_booking(state, args)
                if isinstance(booking, ErrorInfo):
                    return booking
                if self._already(state, "create_payment", booking["booking_id"]):
                    return ErrorInfo(
                        code=ErrorCode.INVALID_TOOL_ARGUMENTS.value,
                        message=f"booking {booking['booking_id']} is already paid or being paid in this run",
                        details={"booking_id": booking["booking_id"]},
                    )
                return {
                    "booking_id": booking["booking_id"],
                    "guest_id": state.guest_id,
                    "amount_cents": int(booking["total_cents"]),
                    "currency": str(booking.get("currency", "EUR")),
                }
            case "send_confirmation_email" | "update_crm":
                booking = self._held_booking(state, args)
                if isinstance(booking, ErrorInfo):
                    return booking
                return {"booking_id": booking["booking_id"], "guest_id": state.guest_id}
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
            code=ErrorCode.UNKNOWN_BOOKING.value,
            message=f"booking {booking_id} was not created in this run; create_booking first",
            details={"booking_id": booking_id},
        )

    @staticmethod
    def _already(state: RunState, tool: str, booking_id: str) -> bool:
        in_flight = any(p.tool == tool and p.args.get("booking_id") == booking_id for p in state.pending)
        done = any(
            req.tool == tool and req.args.get("booking_id") == booking_id and done.status in ("succeeded", "unknown")
            for req, done in state.completed
        )
        return in_flight or done
