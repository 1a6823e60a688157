"""The coworking tools, each defined once: what the model may send, the contract the executor enforces, and how
the desk provider is asked (and asked again by key after a crash)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from crashsafe.sdk import (
    Effect,
    HttpOperation,
    HttpRequest,
    KeyRule,
    RetryRule,
    Tool,
    ToolContract,
    parameters_of,
)

Day = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}$", description="the day, YYYY-MM-DD")]
Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=40, description="quiet, open or office")]


class FindDesksArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    day: Day
    zone: Zone | None = None


class ReserveDeskArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    zone: Zone
    day: Day


class ReservationRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A day pass names only the reservation: the server reads the price from the provider's answer."""

    reservation_id: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


FIND_DESKS = Tool(
    ToolContract(
        name="find_desks",
        family="desks",
        effect=Effect.READ,
        timeout_s=2.0,
        retry=RetryRule.RETRY,
        max_attempts=3,
        key_rule=KeyRule.NONE,
        description="Free desks per zone on a day, with each zone's day-pass price.",
        parameters=parameters_of(FindDesksArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "GET", "/desks", params={"day": args["day"], "zone": args.get("zone") or ""}
        ),
        lookup_path=None,
        ref_field=None,
        requires=("day",),
    ),
    audited=False,
)

RESERVE_DESK = Tool(
    ToolContract(
        name="reserve_desk",
        family="desks",
        effect=Effect.WRITE,
        timeout_s=3.0,
        retry=RetryRule.KEYED,
        max_attempts=2,
        compensation="release_desk",
        # One desk per member, zone and day: the member asking again (another message, another run) is this
        # reservation, never a second desk. The provider assigns the desk, so nothing else names it.
        key_rule=KeyRule.BUSINESS,
        identity_kind="desk",
        identity=("member_id", "zone", "day"),
        description="Reserve a desk in a zone for the member for a day. Returns the reservation and its price.",
        parameters=parameters_of(ReserveDeskArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST", "/reservations", json={k: args[k] for k in ("member_id", "zone", "day")}
        ),
        lookup_path="/reservations/by-key/{key}",
        ref_field="reservation_id",
        requires=("member_id", "zone", "day"),
    ),
)

BUY_DAY_PASS = Tool(
    ToolContract(
        name="buy_day_pass",
        family="passes",
        effect=Effect.MONEY,
        timeout_s=5.0,
        retry=RetryRule.NEVER_BLIND,
        max_attempts=2,
        # A reservation is paid once, whichever run asks.
        key_rule=KeyRule.BUSINESS,
        identity_kind="pass",
        identity=("reservation_id",),
        description="Charge the member's card on file for the day pass of a reservation (the server prices it).",
        parameters=parameters_of(ReservationRef),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST",
            "/passes",
            json={k: args[k] for k in ("reservation_id", "member_id", "amount_cents", "currency")},
        ),
        lookup_path="/passes/by-key/{key}",
        ref_field="pass_id",
        requires=("reservation_id", "member_id", "amount_cents", "currency"),
        failed_statuses=frozenset({"declined"}),
    ),
)

RELEASE_DESK = Tool(
    ToolContract(
        name="release_desk",
        family="desks",
        effect=Effect.WRITE,
        timeout_s=3.0,
        retry=RetryRule.KEYED,
        max_attempts=3,
        description="Give back a reserved desk whose day pass was not paid.",
    ),
    HttpOperation(
        request=lambda args: HttpRequest("POST", f"/reservations/{args['reservation_id']}/release", json={}),
        lookup_path="/releases/by-key/{key}",
        ref_field="reservation_id",
        requires=("reservation_id",),
    ),
    compensation_only=True,
)

TOOLS = (FIND_DESKS, RESERVE_DESK, BUY_DAY_PASS, RELEASE_DESK)
ARGUMENT_TYPES: dict[str, type[msgspec.Struct]] = {
    "find_desks": FindDesksArgs,
    "reserve_desk": ReserveDeskArgs,
    "buy_day_pass": ReservationRef,
}
